"""A batch on real llama-servers, as a client runs it: the official `openai` client uploads a
file of chat requests sharing two system prompts, creates the batch, polls it until it ends and
downloads what each request answered. Every custom_id comes back once, answered by the model."""

import io
import json

import openai
import pytest_twisted
from twisted.internet.threads import deferToThread

from tests.support.batches import request_lines
from tests.support.harness import wait

ITEMS = 12


@pytest_twisted.ensureDeferred
async def test_the_openai_client_runs_a_batch_on_real_llama_servers(launch):
    crossbar, fleet = await launch()
    oai = openai.OpenAI(base_url=crossbar.url("convo", "/v1"), api_key="none", max_retries=0)

    async def call(fn):
        return await wait(deferToThread(fn), 60)

    file = await call(lambda: oai.files.create(
        file=("tickets.jsonl", io.BytesIO(request_lines(ITEMS, temperature=0))), purpose="batch"))  # fmt: skip
    batch = await call(lambda: oai.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"))  # fmt: skip
    for _ in range(240):  # the runner's ticks, a second of the service each
        await fleet.within(crossbar.parts.batches.tick(), 30, "a batch tick")
        await fleet.within(crossbar.parts.batches.settled(), 30, "batch results written")
        batch = await call(lambda b=batch.id: oai.batches.retrieve(b))
        if batch.status == "completed":
            break
        await fleet.within(_quiet(crossbar), 60, "the batch's items in flight")
    assert batch.status == "completed", batch
    assert batch.request_counts.completed == ITEMS and batch.error_file_id is None
    text = (await call(lambda: oai.files.content(batch.output_file_id))).text
    lines = [json.loads(line) for line in text.splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(f"req-{i}" for i in range(ITEMS))
    for line in lines:
        body = line["response"]["body"]
        assert line["response"]["status_code"] == 200
        assert body["choices"][0]["message"]["content"].strip()
        assert body["usage"]["completion_tokens"] > 0
    assert batch.usage.output_tokens == sum(
        line["response"]["body"]["usage"]["completion_tokens"] for line in lines
    )


async def _quiet(crossbar):
    from tests.support.harness import until

    await until(lambda: crossbar.parts.batches.in_flight == 0, 55)
