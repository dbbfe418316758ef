"""The official clients' own ways of saying a request's class reach crossbar (issue 48):
OpenAI's `service_tier="flex"` runs as batch, Anthropic's client names a class by header, and
both see the class in the answer's `X-Crossbar-Class`."""

from __future__ import annotations

import anthropic
import openai
import pytest_twisted
from twisted.internet.threads import deferToThread

from tests.support.harness import MODEL, start_crossbar, start_fakes, wait

HELLO = [{"role": "user", "content": "Summarize the file."}]
ROUTES = {"convo": {"hosts": ["titan"], "default_model": MODEL}}


@pytest_twisted.async_yield_fixture
async def crossbar():
    fakes = await start_fakes("titan", tokens_per_second=2000)
    running = await start_crossbar(fakes, ROUTES, parallel=2)
    rows: list = []
    running.parts.usage.observers.append(rows.append)
    yield running, rows
    await running.stop()


@pytest_twisted.ensureDeferred
async def test_openais_flex_tier_runs_as_batch_and_the_answer_says_so(crossbar):
    crossbar, rows = crossbar
    client = openai.OpenAI(base_url=crossbar.url("convo", "/v1"), api_key="x", max_retries=0)

    def call(tier: str | None):
        extra = {} if tier is None else {"service_tier": tier}
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=HELLO, max_tokens=8, **extra
        )
        return raw.headers.get("x-crossbar-class")

    flex = await wait(deferToThread(call, "flex"), 60)
    plain = await wait(deferToThread(call, None), 60)
    assert (flex, plain) == ("batch", "standard")
    assert [row.request_class for row in rows] == ["batch", "standard"]


@pytest_twisted.ensureDeferred
async def test_anthropics_client_names_its_class_by_header_and_sees_it_in_the_answer(crossbar):
    crossbar, rows = crossbar
    client = anthropic.Anthropic(base_url=crossbar.url("convo", ""), api_key="x", max_retries=0)

    def call() -> str | None:
        raw = client.messages.with_raw_response.create(
            model=MODEL, max_tokens=8, messages=HELLO, extra_headers={"X-Crossbar-Class": "batch"}
        )
        return raw.headers.get("x-crossbar-class")

    assert await wait(deferToThread(call), 60) == "batch"
    assert rows[-1].request_class == "batch"
