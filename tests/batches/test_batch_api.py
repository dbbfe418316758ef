"""The Batch API told as a client runs it: the official `openai` client uploads a file, creates
a batch, polls it to the end and downloads its results, against crossbar in front of fakes.
The runner's timer is the test's: each `tick` is one of the service's seconds."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import openai
import pytest_twisted
from twisted.internet.threads import deferToThread

from tests.support.harness import MODEL, Crossbar, start_crossbar, start_fakes, until, wait

ROUTE = {"convo": {"hosts": ["a", "b"]}}


def client(crossbar: Crossbar, route: str = "convo", key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=crossbar.url(route, "/v1"), api_key=key, max_retries=0)


async def call(fn: Callable[[], Any]) -> Any:
    return await wait(deferToThread(fn), 60)


def request_lines(n: int, systems: int = 2, **body: Any) -> bytes:
    out = []
    for i in range(n):
        messages = [
            {"role": "system", "content": f"You label tickets, style {i % systems}."},
            {"role": "user", "content": f"ticket {i}: the printer is on fire"},
        ]
        out.append(
            json.dumps(
                {
                    "custom_id": f"req-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {"model": MODEL, "messages": messages, "max_tokens": 8, **body},
                }
            )
        )
    return ("\n".join(out) + "\n").encode()


async def run_to_end(crossbar: Crossbar, oai: openai.OpenAI, batch_id: str) -> Any:
    """Tick the runner until the batch ends; the batch as the client then sees it."""
    for _ in range(200):
        await crossbar.parts.batches.tick()
        batch = await call(lambda: oai.batches.retrieve(batch_id))
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        await until(lambda: crossbar.parts.batches.in_flight == 0, 10)
    raise AssertionError("the batch never ended")


@pytest_twisted.ensureDeferred
async def test_the_openai_client_runs_a_batch_end_to_end() -> None:
    fakes = await start_fakes("a", "b")
    crossbar = await start_crossbar(fakes, ROUTE)
    try:
        oai = client(crossbar)
        uploaded = await call(
            lambda: oai.files.create(
                file=("tickets.jsonl", io.BytesIO(request_lines(12))), purpose="batch"
            )
        )
        assert uploaded.purpose == "batch" and uploaded.filename == "tickets.jsonl"
        batch = await call(
            lambda: oai.batches.create(
                input_file_id=uploaded.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
                metadata={"job": "tickets"},
            )
        )
        assert batch.status == "in_progress"
        assert batch.request_counts.total == 12
        done = await run_to_end(crossbar, oai, batch.id)
        assert done.status == "completed"
        assert done.request_counts.completed == 12 and done.request_counts.failed == 0
        assert done.metadata == {"job": "tickets"}
        assert done.error_file_id is None
        text = (await call(lambda: oai.files.content(done.output_file_id))).text
        lines = [json.loads(line) for line in text.splitlines()]
        assert sorted(line["custom_id"] for line in lines) == sorted(f"req-{i}" for i in range(12))
        for line in lines:
            assert line["response"]["status_code"] == 200
            assert line["response"]["body"]["choices"][0]["message"]["content"]
            assert line["error"] is None
        assert done.usage.input_tokens > 0 and done.usage.output_tokens > 0
        # Each item went through the request path at class batch: its usage rows say so.
        await crossbar.parts.usage.flush()
        rows = await crossbar.parts.store._query(
            "rows",
            "SELECT request_class, path, status FROM usage WHERE path = '/v1/chat/completions'",
        )
        assert rows == [("batch", "/v1/chat/completions", 200)] * 12
    finally:
        await crossbar.stop()
