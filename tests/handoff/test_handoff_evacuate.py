"""Evacuating a host moves its conversations warm: their next turn finds the prompt cached.

A fake fleet with a prefill cost per uncached token: twenty conversations on one host, the
host evacuated, each conversation's next turn on its new host. With the hand-off store the
new host was prewarmed and caches at least 90% of the prompt; without it (the same steps, the
store off) almost nothing. A turn arriving while its conversation's prewarm runs waits for it
and is answered once.
"""

from __future__ import annotations

import json
from typing import Any

import pytest_twisted
from prometheus_client import CollectorRegistry
from twisted.internet.defer import Deferred, ensureDeferred

from crossbar.handoff.moves import HandOff
from crossbar.handoff.prewarm import Outcome
from crossbar.leases.table import Key
from tests.support.harness import MODEL, Crossbar, start_crossbar, start_fakes, turn, wait

ROUTES = {"convo": {"hosts": ["a", "b", "c"], "default_model": MODEL}}
FLEET = {"prefill_ms_per_token": 0.05, "cache_slots": 32, "parallel": 2}


def opening(n: int) -> list[dict[str, Any]]:
    """A conversation of its own: a long first message no other conversation shares."""
    words = " ".join(f"c{n}w{i}" for i in range(400))
    return [{"role": "user", "content": f"Conversation {n}: please read this. {words}"}]


async def fleet_with_conversations(store: str, n: int) -> tuple[Crossbar, list[Any]]:
    """Crossbar over hosts a, b, c with `n` conversations of one turn each, all on a."""
    fakes = await start_fakes("a", "b", "c", **FLEET)
    crossbar = await start_crossbar(fakes, ROUTES, server={"handoff_store": store})
    hosts = crossbar.parts.hosts
    await hosts.drain("b")
    await hosts.drain("c")
    conversations = []
    for i in range(n):
        messages = opening(i)
        response, reply = await wait(crossbar.chat("convo", messages, max_tokens=4))
        assert response.headers.getRawHeaders("X-Crossbar-Host") == ["a"]
        conversations.append(turn(messages, reply, "And now?"))
    await hosts.undrain("b")
    await hosts.undrain("c")
    await wait(crossbar.parts.handoff.store.flushed())  # the bodies are written
    return crossbar, conversations


async def next_turns(crossbar: Crossbar, conversations: list[Any]) -> tuple[int, int]:
    """Every conversation's next turn: (cached, prompt) tokens over all of them."""
    cached = prompt = 0
    for messages in conversations:
        response, reply = await wait(crossbar.chat("convo", messages, max_tokens=4))
        assert response.code == 200
        assert response.headers.getRawHeaders("X-Crossbar-Host") != ["a"]
        usage = reply["usage"]
        prompt += usage["prompt_tokens"]
        cached += usage["prompt_tokens_details"]["cached_tokens"]
    return cached, prompt


async def evacuate(crossbar: Crossbar, host: str) -> Any:
    evacuation = await crossbar.parts.handoff.evacuator.start(host)
    await wait(evacuation.done, 30)
    return evacuation


@pytest_twisted.ensureDeferred
async def test_evacuated_conversations_find_their_prompt_cached_only_when_prewarmed():
    ratios = {}
    for store in ("0", "64MiB"):
        crossbar, conversations = await fleet_with_conversations(store, 20)
        try:
            evacuation = await evacuate(crossbar, "a")
            assert (evacuation.total, evacuation.moved, evacuation.left) == (20, 20, 0)
            assert evacuation.warm == (20 if store != "0" else 0)
            assert crossbar.parts.table.count("a", MODEL) == 0  # the host can be stopped
            assert {x.host for x in crossbar.parts.table.snapshot()} == {"b", "c"}
            cached, prompt = await next_turns(crossbar, conversations)
            ratios[store] = cached / prompt
            events = await crossbar.parts.store.list_events(route="convo", limit=100)
            assert sum(e.reason == "evacuate" and e.from_host == "a" for e in events) == 20
            metrics = crossbar.parts.metrics.render().decode()
            if store != "0":
                assert "crossbar_handoff_cache_ratio_count 20.0" in metrics
                assert 'crossbar_prewarm_tokens_total{host="b",kind="prompt"}' in metrics
        finally:
            await crossbar.stop()
    assert ratios["64MiB"] >= 0.9, ratios
    assert ratios["0"] <= 0.05, ratios


@pytest_twisted.ensureDeferred
async def test_a_turn_arriving_mid_prewarm_waits_for_it_and_is_answered_once():
    crossbar, conversations = await fleet_with_conversations("64MiB", 3)
    try:
        table, handoff = crossbar.parts.table, crossbar.parts.handoff.handoff
        evacuation = await crossbar.parts.handoff.evacuator.start("a")
        keys = [lease.key for lease in table.snapshot()]
        assert all(handoff.moving(key) for key in keys)  # every prewarm is under way
        # The conversation's next turn, sent now: it waits for its move, then goes warm.
        response, reply = await wait(crossbar.chat("convo", conversations[0], max_tokens=4))
        await wait(evacuation.done)
        assert response.code == 200
        (host,) = response.headers.getRawHeaders("X-Crossbar-Host")
        assert host in ("b", "c")
        usage = reply["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 0.9 * usage["prompt_tokens"]
        # Answered exactly once: one generation for it in the whole fleet, on its new host
        # (the prewarm generated nothing).
        answered = [
            (name, c)
            for name, fake in crossbar.fakes.items()
            for c in fake.counters.completions
            if c.opening == conversations[0][0]["content"] and c.completion_tokens
        ]
        assert [name for name, _ in answered] == ["a", host]  # turn 1 on a, turn 2 moved
        assert reply["choices"][0]["message"]["content"] == answered[1][1].text
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_turn_waits_no_longer_than_prewarm_timeout():
    fakes = await start_fakes("a", "b", **FLEET)
    routes = {"convo": {"hosts": ["a", "b"], "default_model": MODEL}}
    server = {"handoff_store": "1MiB", "prewarm_timeout": "50ms"}
    crossbar = await start_crossbar(fakes, routes, server=server)
    try:
        messages = opening(1)
        _, reply = await wait(crossbar.chat("convo", messages, max_tokens=4))
        (lease,) = crossbar.parts.table.snapshot()
        fakes["b"].faults.hang = True  # the prewarm never ends
        handoff = crossbar.parts.handoff.handoff
        move = handoff.move(Key(lease.key.route, lease.key.fp, MODEL), "b", "evacuate")
        moving = Deferred.fromCoroutine(move)
        assert handoff.moving(lease.key)
        response, _ = await wait(
            crossbar.chat("convo", turn(messages, reply, "more"), max_tokens=4)
        )
        assert response.code == 200
        assert response.headers.getRawHeaders("X-Crossbar-Host") == ["a"]  # went at once
        moving.cancel()
    finally:
        fakes["b"].faults.hang = False
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_conversations_in_every_prewarmable_dialect_move_warm():
    fakes = await start_fakes("a", "b", **FLEET)
    routes = {"convo": {"hosts": ["a", "b"], "default_model": MODEL}}
    crossbar = await start_crossbar(fakes, routes, server={"handoff_store": "4MiB"})
    words = " ".join(f"w{i}" for i in range(300))
    bodies = {
        "/v1/messages": {"max_tokens": 4, "messages": [{"role": "user", "content": words}]},
        "/v1/completions": {"max_tokens": 4, "prompt": "completions " + words},
        "/completion": {"n_predict": 4, "prompt": "native " + words},
    }
    try:
        await crossbar.parts.hosts.drain("b")
        for path, body in bodies.items():
            await wait(post(crossbar, path, body))
        await crossbar.parts.hosts.undrain("b")
        await wait(crossbar.parts.handoff.store.flushed())
        evacuation = await evacuate(crossbar, "a")
        assert (evacuation.moved, evacuation.warm) == (3, 3)
        before = len(fakes["b"].counters.completions)
        for path, body in bodies.items():
            await wait(post(crossbar, path, body))  # the same prompt again, on b
        for done in fakes["b"].counters.completions[before:]:
            assert done.cache_n >= 0.9 * done.prompt_tokens, done
    finally:
        await crossbar.stop()


async def post(crossbar: Crossbar, path: str, body: dict[str, Any]) -> None:
    response = await crossbar.client().post(
        crossbar.url("convo", path),
        data=json.dumps({"model": MODEL, **body}).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert response.code == 200, await response.content()
    await response.content()


@pytest_twisted.ensureDeferred
async def test_three_evacuations_of_one_host_at_once_are_one_evacuation():
    crossbar, _ = await fleet_with_conversations("8MiB", 20)
    try:
        evacuator = crossbar.parts.handoff.evacuator
        started = [ensureDeferred(evacuator.start("a")) for _ in range(3)]
        evacuations = [await wait(d) for d in started]
        assert evacuations[0] is evacuations[1] is evacuations[2]  # the running one's progress
        await wait(evacuations[0].done, 30)
        view = evacuations[0].view()
        assert (view["moved"], view["failed"], view["total"]) == (20, 0, 20)
        assert crossbar.parts.table.count("a", MODEL) == 0
    finally:
        await crossbar.stop()


class HeldPrewarm:
    """A prewarm that ends when the test says."""

    def __init__(self) -> None:
        self.release: Deferred[None] = Deferred()

    async def prewarm(self, key: Key, host: str, parent: Any = None) -> Outcome:
        await self.release
        return Outcome("warm")

    def reconfigure(self, config: Any) -> None:
        pass


@pytest_twisted.ensureDeferred
async def test_a_lease_that_left_its_host_during_the_prewarm_is_not_moved_again():
    # An evacuation `now` stops an answer whose conversation's prewarm still runs: the
    # continuation takes the lease along to the host it goes on. The move, once its prewarm
    # ends, leaves the lease there: the answer's text is cached there, not on the planned host.
    fakes = await start_fakes("a", "b", "c", **FLEET)
    crossbar = await start_crossbar(fakes, {"convo": {"hosts": ["a"], "default_model": MODEL}})
    try:
        await wait(crossbar.chat("convo", opening(1), max_tokens=4))
        (lease,) = crossbar.parts.table.snapshot()
        table, prewarm = crossbar.parts.table, HeldPrewarm()
        handoff = HandOff(
            crossbar.parts.clock, crossbar.config, table, crossbar.parts.handoff.store,
            prewarm, CollectorRegistry(),  # type: ignore[arg-type]
        )  # fmt: skip
        moving = Deferred.fromCoroutine(handoff.move(lease.key, "b", "evacuate"))
        now = crossbar.parts.clock.seconds()
        assert await wait(table.move(lease.key, "c", now, "resumed"))  # the answer went on
        prewarm.release.callback(None)
        moved = await wait(moving)
        assert (moved.origin, moved.moved) == ("a", False)
        assert table.lease(lease.key).host == "c"
    finally:
        await crossbar.stop()
