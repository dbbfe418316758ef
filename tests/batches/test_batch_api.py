"""The Batch API told as a client runs it: the official `openai` client uploads a file, creates
a batch, polls it to the end and downloads its results, against crossbar in front of fakes.
The runner's timer is the test's: each `tick` is one of the service's seconds."""

from __future__ import annotations

import io
import json
from typing import Any

import openai
import pytest_twisted

from tests.support.batches import call, client, request_lines
from tests.support.harness import Crossbar, start_crossbar, start_fakes, until

ROUTE = {"convo": {"hosts": ["a", "b"]}}


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


async def submit(oai: openai.OpenAI, content: bytes) -> Any:
    file = await call(lambda: oai.files.create(file=("in.jsonl", io.BytesIO(content)),
                                               purpose="batch"))  # fmt: skip
    return await call(lambda: oai.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"))  # fmt: skip


async def both_files(oai: openai.OpenAI, batch: Any) -> tuple[list[Any], list[Any]]:
    found = []
    for file_id in (batch.output_file_id, batch.error_file_id):
        text = (await call(lambda f=file_id: oai.files.content(f))).text if file_id else ""
        found.append([json.loads(line) for line in text.splitlines()])
    return found[0], found[1]


@pytest_twisted.ensureDeferred
async def test_a_key_whose_budget_runs_out_mid_batch_sends_the_rest_to_the_error_file() -> None:
    fakes = await start_fakes("a", "b")
    keys = {"labeller": {"secret": "sk-labeller-0123456789", "tokens_per_day": 150}}
    crossbar = await start_crossbar(fakes, ROUTE, keys=keys, server={"batch_in_flight": 1})
    try:
        oai = client(crossbar, key="sk-labeller-0123456789")
        batch = await submit(oai, request_lines(10))
        done = await run_to_end(crossbar, oai, batch.id)
        output, errors = await both_files(oai, done)
        assert output and errors  # some ran before the budget was spent, the rest did not
        assert sorted(line["custom_id"] for line in output + errors) == sorted(
            f"req-{i}" for i in range(10)
        )
        for line in errors:
            assert line["response"]["status_code"] == 429
            assert "(tokens_per_day)" in line["response"]["body"]["error"]["message"]
        # Each item was charged to the batch's key as a request: usage rows name it.
        await crossbar.parts.usage.flush()
        rows = await crossbar.parts.store._query(
            "rows", "SELECT DISTINCT key FROM usage WHERE path = '/v1/chat/completions'"
        )
        assert rows == [("labeller",)]
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_items_of_a_route_whose_hosts_are_down_are_served_by_its_fallback() -> None:
    fakes = await start_fakes("a", "b")
    routes = {"main": {"hosts": ["a"], "fallbacks": ["spare"]}, "spare": {"hosts": ["b"]}}
    crossbar = await start_crossbar(fakes, routes)
    try:
        fakes["a"].faults.busy = 503
        oai = client(crossbar, "main")
        batch = await submit(oai, request_lines(4))
        done = await run_to_end(crossbar, oai, batch.id)
        output, errors = await both_files(oai, done)
        assert len(output) == 4 and errors == []
        await crossbar.parts.usage.flush()
        rows = await crossbar.parts.store._query(
            "rows",
            "SELECT route, host, fallback_from FROM usage WHERE path = '/v1/chat/completions'",
        )
        assert set(rows) == {("spare", "b", "main")}
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_host_that_keeps_failing_sends_items_to_the_error_file_after_their_retries() -> (
    None
):
    fakes = await start_fakes("a")
    crossbar = await start_crossbar(fakes, {"convo": {"hosts": ["a"]}},
                                    server={"batch_retries": 0})  # fmt: skip
    try:
        fakes["a"].faults.error_500 = True
        oai = client(crossbar)
        batch = await submit(oai, request_lines(3))
        done = await run_to_end(crossbar, oai, batch.id)
        assert done.status == "completed" and done.request_counts.failed == 3
        _, errors = await both_files(oai, done)
        assert [line["response"]["status_code"] for line in errors] == [500] * 3
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_person_beside_a_running_batch_is_served_first() -> None:
    fakes = await start_fakes("a", tokens_per_second=40, parallel=2)
    crossbar = await start_crossbar(fakes, {"convo": {"hosts": ["a"]}}, parallel=2)
    try:
        oai = client(crossbar)
        batch = await submit(oai, request_lines(8, max_tokens=8))
        await crossbar.parts.batches.tick()
        await until(lambda: crossbar.parts.batches.in_flight >= 1, 5)
        # The batch runs what the host's batch cap lets start (one slot: the cap leaves one
        # for people) and no more: the turn starts at once.
        assert crossbar.parts.batches.in_flight == 1
        response, _ = await crossbar.chat("convo", [{"role": "user", "content": "hello"}],
                                              max_tokens=4)  # fmt: skip
        assert response.code == 200
        assert int(response.headers.getRawHeaders("X-Crossbar-Queue-Ms")[0]) < 100
        assert response.headers.getRawHeaders("X-Crossbar-Class") == ["standard"]
        done = await run_to_end(crossbar, oai, batch.id)
        assert done.request_counts.completed == 8
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_the_client_cancels_a_batch_and_what_ran_is_kept() -> None:
    fakes = await start_fakes("a", tokens_per_second=20)
    crossbar = await start_crossbar(fakes, {"convo": {"hosts": ["a"]}},
                                    server={"batch_in_flight": 1})  # fmt: skip
    try:
        oai = client(crossbar)
        batch = await submit(oai, request_lines(5, max_tokens=8))
        await crossbar.parts.batches.tick()
        assert crossbar.parts.batches.in_flight == 1
        cancelling = await call(lambda: oai.batches.cancel(batch.id))
        assert cancelling.status == "cancelling" and cancelling.cancelling_at
        done = await run_to_end(crossbar, oai, batch.id)
        assert done.status == "cancelled" and done.cancelled_at
        output, errors = await both_files(oai, done)
        assert [line["custom_id"] for line in output] == ["req-0"]  # it was running: it ran
        assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
            (f"req-{i}", "batch_cancelled") for i in range(1, 5)
        ]
        again = await call(lambda: oai.batches.cancel(batch.id))
        assert again.status == "cancelled"  # cancelling an ended batch changes nothing
    finally:
        await crossbar.stop()
