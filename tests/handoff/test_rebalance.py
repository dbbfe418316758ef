"""Rebalance: a host whose queue stays full sheds its idle conversations to a cool host.

The rebalancer runs on an injected clock here (started at the wall time the leases were made
at); the fleet, the table and the limiter are real.
"""

from __future__ import annotations

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from crossbar.handoff.rebalance import Rebalancer
from tests.handoff.test_handoff_evacuate import opening
from tests.support.harness import MODEL, start_crossbar, start_fakes, turn, until, wait

ROUTE = {
    "hosts": ["a", "b"],
    "default_model": MODEL,
    "rebalance": True,
    "rebalance_after": "30s",
    "rebalance_idle": "20s",
    "rebalance_per_minute": 2,
}


async def fleet(route, n=6):
    fakes = await start_fakes("a", "b", parallel=1, cache_slots=8)
    crossbar = await start_crossbar(fakes, {"convo": route}, server={"handoff_store": "4MiB"})
    await crossbar.parts.hosts.drain("b")
    conversations = []
    for i in range(n):
        messages = opening(i)
        _, reply = await wait(crossbar.chat("convo", messages, max_tokens=2))
        conversations.append(turn(messages, reply, "next"))
    await crossbar.parts.hosts.undrain("b")
    await wait(crossbar.parts.handoff.store.flushed())
    p = crossbar.parts
    clock = Clock()
    clock.advance(reactor.seconds())
    rebalancer = Rebalancer(clock, crossbar.config, p.table, p.hosts, p.limiter, p.handoff.handoff)
    return crossbar, conversations, clock, rebalancer


def homes(crossbar) -> dict[str, str]:
    return {lease.key.fp: lease.host for lease in crossbar.parts.table.snapshot()}


@pytest_twisted.ensureDeferred
async def test_idle_conversations_leave_a_host_queued_for_rebalance_after_until_even():
    crossbar, conversations, clock, rebalancer = await fleet(ROUTE)
    limiter = crossbar.parts.limiter
    try:
        fps = [lease.key.fp for lease in sorted(crossbar.parts.table.snapshot(),
                                               key=lambda x: x.last_used)]  # fmt: skip
        release = await limiter.acquire("a", MODEL)  # a's one slot is busy...
        # ...and conversation 0's next turn waits for it: a's queue is not empty, and that
        # conversation has a request in flight, so it never moves.
        waiting = Deferred.fromCoroutine(crossbar.chat("convo", conversations[0], max_tokens=2))
        await until(lambda: limiter.queued("a", MODEL) == 1)
        assert rebalancer.tick() == 0  # hot from now on
        clock.advance(29)
        assert rebalancer.tick() == 0  # not for rebalance_after yet
        clock.advance(1)
        assert rebalancer.tick() == 1  # one free slot on b: one move at a time
        await wait(rebalancer.moves[0])
        assert rebalancer.tick() == 1
        await wait(rebalancer.moves[0])
        assert rebalancer.tick() == 0  # rebalance_per_minute = 2
        assert [homes(crossbar)[fp] for fp in fps] == ["a", "b", "b", "a", "a", "a"]
        clock.advance(60)
        assert rebalancer.tick() == 1
        await wait(rebalancer.moves[0])
        assert [homes(crossbar)[fp] for fp in fps] == ["a", "b", "b", "b", "a", "a"]
        clock.advance(60)
        # The rate allows more, but three each is even: a fourth would only move the queue.
        assert rebalancer.tick() == 0
        events = await crossbar.parts.store.list_events(route="convo", limit=50)
        assert sorted(e.fp for e in events if e.reason == "rebalance") == sorted(fps[1:4])
        release()
        response, _ = await wait(waiting)
        assert response.headers.getRawHeaders("X-Crossbar-Host") == ["a"]
        # A moved conversation's next turn finds its prompt on b.
        response, reply = await wait(crossbar.chat("convo", conversations[1], max_tokens=2))
        assert response.headers.getRawHeaders("X-Crossbar-Host") == ["b"]
        usage = reply["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 0.9 * usage["prompt_tokens"]
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_routes_without_rebalance_and_busy_hosts_without_a_cool_one_move_nobody():
    crossbar, _, clock, rebalancer = await fleet({**ROUTE, "rebalance": False})
    limiter = crossbar.parts.limiter
    try:
        release = await limiter.acquire("a", MODEL)
        waiter = limiter.acquire("a", MODEL)
        rebalancer.tick()
        clock.advance(120)
        assert rebalancer.tick() == 0
        assert set(homes(crossbar).values()) == {"a"}
        waiter.cancel()
        release()
    finally:
        await crossbar.stop()
