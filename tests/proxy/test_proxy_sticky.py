"""Conversations stay on the host whose prompt cache holds them."""

import json

import pytest_twisted
from twisted.internet.threads import deferToThread

from tests.support.harness import MODEL, start_fakes, turn, wait
from tests.support.routes import CONVO

ROUTES = CONVO


@pytest_twisted.ensureDeferred
async def test_two_conversations_land_on_two_hosts_and_stay_for_ten_turns(launch):
    crossbar = await launch(await start_fakes("titan", "atlas"), ROUTES, parallel=2)
    homes, cached = {}, {}
    histories = {
        name: [{"role": "user", "content": f"Conversation {name}: write a parser."}]
        for name in ("a", "b")
    }
    for n in range(10):
        for name, history in histories.items():
            response, reply = await wait(crossbar.chat("convo", history))
            assert response.code == 200
            host = response.headers.getRawHeaders("X-Crossbar-Host")[0]
            lease = response.headers.getRawHeaders("X-Crossbar-Lease")[0]
            assert lease == ("new" if n == 0 else "reused")
            assert homes.setdefault(name, host) == host
            cached.setdefault(name, []).append(reply["timings"]["cache_n"])
            histories[name] = turn(history, reply, f"turn {n + 1}")
    assert homes["a"] != homes["b"]
    for name in histories:
        assert all(c > 0 for c in cached[name][1:]), cached[name]
    counts = {h: f.counters.requests["/v1/chat/completions"] for h, f in crossbar.fakes.items()}
    assert counts == {"titan": 10, "atlas": 10}


@pytest_twisted.ensureDeferred
async def test_the_openai_client_streams_through_crossbar_the_text_the_fake_sent(launch):
    from openai import OpenAI

    crossbar = await launch(await start_fakes("titan"), {"convo": {"hosts": ["titan"]}})
    messages = [{"role": "user", "content": "Say something deterministic."}]

    def stream() -> str:
        client = OpenAI(base_url=crossbar.url("convo", "/v1"), api_key="none", max_retries=0)
        chunks = client.chat.completions.create(model=MODEL, messages=messages, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        client.close()
        return text

    text = await wait(deferToThread(stream), 30)
    (completion,) = crossbar.fakes["titan"].counters.completions
    assert completion.stream and completion.outcome == "done"
    assert text == completion.text and text


@pytest_twisted.ensureDeferred
async def test_a_usage_row_records_tokens_lease_and_timings(launch):
    crossbar = await launch(await start_fakes("titan"), {"convo": {"hosts": ["titan"]}})
    rows = []
    crossbar.parts.usage.observers.append(rows.append)
    history = [{"role": "user", "content": "Count my tokens please."}]
    _, reply = await wait(crossbar.chat("convo", history))
    await wait(crossbar.chat("convo", turn(history, reply, "again")))
    first, second = rows
    assert (first.route, first.model, first.host, first.path) == (
        "convo",
        MODEL,
        "titan",
        "/v1/chat/completions",
    )
    assert (first.status, first.stream, first.lease, first.error) == (200, False, "new", "")
    assert first.prompt_tokens == reply["usage"]["prompt_tokens"] > 0
    assert first.completion_tokens == reply["usage"]["completion_tokens"] > 0
    assert second.cached_tokens > 0 and second.lease == "reused"
    assert first.fp == second.fp != ""
    assert first.ttfb_ms is not None and first.duration_ms >= first.ttfb_ms
    await crossbar.parts.usage.flush()  # the rows finished behind a write in flight
    totals = await crossbar.parts.store.usage_totals("route", None)
    assert totals[0]["requests"] == 2


@pytest_twisted.ensureDeferred
async def test_models_and_health_are_answered_by_crossbar(launch):
    crossbar = await launch(await start_fakes("titan"), {"convo": {"hosts": ["titan"]}})
    client = crossbar.client()
    models = json.loads(await (await client.get(crossbar.url("convo", "/v1/models"))).content())
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [MODEL]
    health = await client.get(crossbar.url("convo", "/health"))
    assert health.code == 200
    await health.content()
    assert crossbar.fakes["titan"].counters.requests["/v1/models"] == 0


@pytest_twisted.ensureDeferred
async def test_the_route_header_and_the_default_route_find_the_route(launch):
    fakes = await start_fakes("titan")
    crossbar = await launch(
        fakes, {"convo": {"hosts": ["titan"]}}, server={"default_route": "convo"}
    )
    client = crossbar.client()
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    for url, headers in (
        (f"{crossbar.base}/v1/chat/completions", {}),
        (f"{crossbar.base}/v1/chat/completions", {"X-Crossbar-Route": "convo"}),
    ):
        response = await client.post(url, data=body, headers=headers)
        assert response.code == 200
        assert response.headers.getRawHeaders("X-Crossbar-Host") == ["titan"]
        await response.content()
