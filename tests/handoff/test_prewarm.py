"""A prewarm replays a conversation's prompt on a host, generating nothing, below every client."""

from __future__ import annotations

import pytest_twisted
from twisted.internet.defer import Deferred

from crossbar.handoff.prewarm import suppressed
from tests.handoff.test_handoff_evacuate import opening
from tests.support.harness import MODEL, start_crossbar, start_fakes, turn, until, wait

ROUTES = {"convo": {"hosts": ["a", "b"], "default_model": MODEL}}


def test_a_prewarm_asks_for_no_tokens_by_every_name_llama_server_reads():
    body = {"messages": [], "max_completion_tokens": 500, "stream": True, "id_slot": 1,
            "stream_options": {"include_usage": True}, "temperature": 0.2}  # fmt: skip
    out = suppressed(body)
    assert out == {"messages": [], "temperature": 0.2, "n_predict": 0, "max_tokens": 0,
                   "stream": False, "cache_prompt": True}  # fmt: skip


async def conversation_on_a(prefill_ms: float, parallel: int = 1):
    fakes = await start_fakes("a", "b", prefill_ms_per_token=prefill_ms, parallel=parallel)
    crossbar = await start_crossbar(fakes, ROUTES, server={"handoff_store": "1MiB"})
    await crossbar.parts.hosts.drain("b")
    messages = opening(1)
    _, reply = await wait(crossbar.chat("convo", messages, max_tokens=4))
    await crossbar.parts.hosts.undrain("b")
    await wait(crossbar.parts.handoff.store.flushed())
    (lease,) = crossbar.parts.table.snapshot()
    return crossbar, lease.key, turn(messages, reply, "go on")


@pytest_twisted.ensureDeferred
async def test_a_prewarm_generates_nothing_and_is_recorded_apart():
    crossbar, key, _ = await conversation_on_a(0)
    rows = []
    crossbar.parts.usage.observers.append(rows.append)
    try:
        moved = await wait(crossbar.parts.handoff.handoff.move(key, "b", "rebalance"))
        assert moved.moved and moved.prewarm.result == "warm"
        (done,) = crossbar.fakes["b"].counters.completions
        assert done.completion_tokens == 0 and done.prompt_n == moved.prewarm.prompt_tokens
        (row,) = rows
        assert (row.lease, row.host, row.status, row.completion_tokens) == ("prewarm", "b", 200, 0)
        metrics = crossbar.parts.metrics.render().decode()
        assert f'crossbar_prewarm_tokens_total{{host="b",kind="prompt"}} {done.prompt_n}.0' in (
            metrics
        )
        assert 'crossbar_requests_total{host="b"' not in metrics
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_client_never_waits_behind_a_prewarm_it_takes_its_slot():
    # One slot on b; a prewarm of a long prompt holds it (1 ms per uncached token).
    crossbar, key, _ = await conversation_on_a(1.0)
    limiter = crossbar.parts.limiter
    try:
        await crossbar.parts.hosts.drain("a")  # new conversations go to b
        moving = Deferred.fromCoroutine(crossbar.parts.handoff.handoff.move(key, "b", "evacuate"))
        await until(lambda: limiter.in_flight("b", MODEL) == 1)
        response, _ = await wait(
            crossbar.chat("convo", [{"role": "user", "content": "hi"}], max_tokens=2)
        )
        assert response.code == 200
        assert response.headers.getRawHeaders("X-Crossbar-Host") == ["b"]
        # Taken from the prewarm at once, not after its prefill (about 800 ms of it).
        (queued,) = response.headers.getRawHeaders("X-Crossbar-Queue-Ms")
        assert int(queued) < 400
        moved = await wait(moving, 30)
        assert moved.moved and moved.prewarm.result == "warm"  # tried again once b was free
        outcomes = [c.outcome for c in crossbar.fakes["b"].counters.completions]
        assert outcomes.count("done") == 2  # the client's answer and the prewarm's second try
    finally:
        await crossbar.stop()
