"""Routes sharing one host through a real crossbar and a slow fake: a priority route's request
jumps a batch backlog; without priority it waits the whole backlog out; caps and queue
bounds answer as the limiter says."""

from __future__ import annotations

import json

import pytest_twisted

from crossbar.records import UsageRow
from tests.support.harness import MODEL, start_crossbar, start_fakes, until, wait

FLOOD = 30
TOKENS = 8  # per request; at TOKENS_PER_SECOND each holds the only slot >= 80 ms
TOKENS_PER_SECOND = 100
AT_LEAST_MS = TOKENS / TOKENS_PER_SECOND * 1000


def body(text: str, max_tokens: int = TOKENS) -> bytes:
    return json.dumps(
        {"model": MODEL, "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}]}
    ).encode()


def queue_ms(response) -> int:
    return int(response.headers.getRawHeaders("X-Crossbar-Queue-Ms")[0])


async def flood_then_agent(agent: dict) -> tuple[int, int, list[UsageRow]]:
    """30 batch requests on a one-slot host, then one agent request once they are all in:
    (the agent's X-Crossbar-Queue-Ms, batch waiters ahead of it when it queued (-1: it was
    admitted before that could be seen), the batch usage rows)."""
    fakes = await start_fakes("titan", parallel=1, tokens_per_second=TOKENS_PER_SECOND)
    routes = {
        "batch": {"hosts": ["titan"], "default_model": MODEL},
        "agent": {"hosts": ["titan"], "default_model": MODEL, **agent},
    }
    crossbar = await start_crossbar(fakes, routes, parallel=1)
    rows: list[UsageRow] = []
    crossbar.parts.usage.observers.append(rows.append)
    limiter = crossbar.parts.limiter
    try:
        client = crossbar.client()
        url = crossbar.url("batch", "/v1/chat/completions")
        flood = [client.post(url, data=body(f"batch job {n}")) for n in range(FLOOD)]

        def all_in() -> bool:
            done = sum(1 for r in rows if r.route == "batch")
            return (
                limiter.in_flight("titan", MODEL) + limiter.queued("titan", MODEL) + done == FLOOD
            )

        await until(all_in, deadline=60)
        assert limiter.queued("titan", MODEL) >= FLOOD // 2, "the flood drained before it was in"
        sent = client.post(crossbar.url("agent", "/v1/chat/completions"), data=body("agent turn"))
        ahead = -1
        if not agent:  # it waits the backlog out: long enough to see it queued
            await until(lambda: "agent" in limiter.queued_by_route("titan", MODEL), deadline=60)
            ahead = limiter.queued_by_route("titan", MODEL)["batch"]
        response = await wait(sent, 120)
        await response.content()
        assert response.code == 200
        waited = queue_ms(response)
        for d in flood:
            await (await wait(d, 120)).content()
    finally:
        await crossbar.stop()
    return waited, ahead, [r for r in rows if r.route == "batch"]


@pytest_twisted.ensureDeferred
async def test_a_priority_route_waits_one_service_time_where_fifo_waits_the_whole_backlog():
    fifo_ms, ahead, _ = await flood_then_agent({})
    priority_ms, _, batch = await flood_then_agent({"priority": 1})

    # Without priority the agent's request waits behind every batch request queued before it.
    assert ahead >= FLOOD // 2
    assert fifo_ms >= ahead * AT_LEAST_MS
    # With priority it waits only for the batch request that held the slot when it came.
    service_ms = max(r.duration_ms - r.queue_ms for r in batch)
    assert priority_ms <= service_ms, (priority_ms, service_ms)
    assert fifo_ms > 10 * priority_ms


@pytest_twisted.ensureDeferred
async def test_a_route_over_its_max_queued_gets_429_with_retry_after_and_others_still_queue(launch):
    fakes = await start_fakes("titan", parallel=1, tokens_per_second=50)
    routes = {
        "batch": {"hosts": ["titan"], "default_model": MODEL, "max_queued": 1},
        "agent": {"hosts": ["titan"], "default_model": MODEL},
    }
    crossbar = await launch(fakes, routes, parallel=1)
    limiter = crossbar.parts.limiter
    client = crossbar.client()
    url = crossbar.url("batch", "/v1/chat/completions")
    first = client.post(url, data=body("one", 20))
    await until(lambda: limiter.in_flight("titan", MODEL) == 1)
    second = client.post(url, data=body("two", 1))
    await until(lambda: limiter.queued("titan", MODEL) == 1)
    refused = await wait(client.post(url, data=body("three", 1)))
    error = json.loads(await refused.content())["error"]
    assert refused.code == 429 and error["type"] == "rate_limit_error"
    assert "max_queued" in error["message"] and "'batch'" in error["message"]
    assert int(refused.headers.getRawHeaders("Retry-After")[0]) >= 1
    other = client.post(crossbar.url("agent", "/v1/chat/completions"), data=body("a", 1))
    await until(lambda: limiter.queued("titan", MODEL) == 2)
    for d in (first, second, other):
        response = await wait(d, 60)
        await response.content()
        assert response.code == 200


@pytest_twisted.ensureDeferred
async def test_a_capped_route_never_has_more_in_flight_than_its_cap_on_a_free_host(launch):
    fakes = await start_fakes("titan", parallel=4, tokens_per_second=50)
    routes = {"batch": {"hosts": ["titan"], "default_model": MODEL, "max_in_flight": 2}}
    crossbar = await launch(fakes, routes, parallel=4)
    limiter = crossbar.parts.limiter
    peak = 0

    def watch() -> bool:
        nonlocal peak
        state = limiter.route("batch")
        peak = max(peak, state.in_flight if state else 0)
        return False

    client = crossbar.client()
    url = crossbar.url("batch", "/v1/chat/completions")
    sent = [client.post(url, data=body(f"job {n}", 5)) for n in range(6)]
    await until(lambda: limiter.queued("titan", MODEL) == 4 or watch())
    assert limiter.in_flight("titan", MODEL) == 2 and limiter.free_slots("titan", MODEL) == 2
    for d in sent:
        watch()
        response = await wait(d, 60)
        await response.content()
        assert response.code == 200
    assert peak <= 2 and fakes["titan"].counters.peak_in_flight == 2
