"""Where batch requests go (issue 48, placement by class), told on the in-memory network.

A batch request has no turn to keep warm: it makes no lease and moves none. It goes where the
batch cap lets it start soonest, and that cap follows the turns, so batch keeps off the host
people are working on. Requests that share a system prompt keep to one host while it has room
for them, so the prompt stays cached there. A batch request that shares a session with a
conversation runs warm beside it, never moving the conversation's lease.
"""

from __future__ import annotations

import json
from typing import Any

import pytest_twisted

from tests.support.memnet import MODEL, Client, Crossbar, start

HOSTS = ("titan", "atlas")
ROUTES = {
    "desk": {"hosts": ["titan"], "default_model": MODEL, "class": "interactive"},
    "old": {"hosts": ["atlas"], "default_model": MODEL},
    "chat": {"hosts": list(HOSTS), "default_model": MODEL},
    "bulk": {"hosts": list(HOSTS), "default_model": MODEL, "class": "batch"},
}
ANSWER = json.dumps({"id": "c1", "choices": [], "usage": {"prompt_tokens": 5}}).encode()


def held_fleet(parallel: int = 3) -> Crossbar:
    """Two hosts whose answers never come: what is running stays running."""
    crossbar = start(ROUTES, hosts=HOSTS, parallel=parallel)
    for name in HOSTS:
        crossbar.net.on_request[name] = lambda host: None
    return crossbar


def ask(crossbar: Crossbar, route: str, user: str, system: str = "", **headers: str) -> Client:
    messages: list[dict[str, Any]] = [{"role": "user", "content": user}]
    if system:
        messages.insert(0, {"role": "system", "content": system})
    body = json.dumps({"model": MODEL, "messages": messages}).encode()
    return crossbar.post(f"/r/{route}/v1/chat/completions", body, **headers)


def batch_on(crossbar: Crossbar) -> dict[str, int]:
    """Batch requests running or waiting on each host."""
    by_host = {}
    for host in HOSTS:
        held, waiting = crossbar.parts.limiter.by_class(host, MODEL)["batch"]
        by_host[host] = held + waiting
    return by_host


def test_a_batch_request_makes_no_lease():
    crossbar = held_fleet()
    for i in range(6):
        ask(crossbar, "bulk", f"record {i}")
    assert sum(batch_on(crossbar).values()) == 6
    assert crossbar.parts.table.snapshot() == []  # nothing to keep warm, nothing leased


def test_batch_keeps_off_the_host_people_are_working_on_not_the_one_with_most_leases():
    crossbar = held_fleet()
    answered = []

    def answer_the_first_three(host: Any) -> None:
        if len(answered) < 3:
            answered.append(host)
            host.answer(ANSWER)

    crossbar.net.on_request["atlas"] = answer_the_first_three
    for person in ("ana", "ben", "cy"):  # three conversations, idle now, leased on atlas
        assert ask(crossbar, "old", f"I am {person}").status == 200
    for person in ("dee", "eve"):  # two turns running on titan
        ask(crossbar, "desk", f"help me, I am {person}")
    leases = [lease.host for lease in crossbar.parts.table.snapshot()]
    assert sorted(leases) == ["atlas"] * 3 + ["titan"] * 2
    ask(crossbar, "bulk", "record 1")
    ask(crossbar, "bulk", "record 2")
    # titan's cap leaves batch one slot, atlas's two: both start on atlas, though it holds
    # the most leases (a new conversation would go to titan).
    assert batch_on(crossbar) == {"titan": 0, "atlas": 2}
    ask(crossbar, "bulk", "record 3")  # atlas's cap is full: titan's spare slot takes it
    assert batch_on(crossbar) == {"titan": 1, "atlas": 2}
    assert crossbar.parts.limiter.free_slots("titan", MODEL) == 0


def test_requests_sharing_a_system_prompt_keep_to_one_host_while_it_has_room():
    crossbar = held_fleet()
    summarize = "Summarize the record in three sentences."
    ask(crossbar, "bulk", "record 1", system=summarize)
    ask(crossbar, "bulk", "record 2", system=summarize)
    assert batch_on(crossbar) == {"titan": 2, "atlas": 0}  # its home, where it is cached
    ask(crossbar, "bulk", "record 3", system=summarize)
    assert batch_on(crossbar) == {"titan": 2, "atlas": 1}  # home is full: it starts at once
    ask(crossbar, "bulk", "a question", system="Translate to French.")
    assert batch_on(crossbar) == {"titan": 2, "atlas": 2}  # another prompt: the most room
    ask(crossbar, "bulk", "record 4", system=summarize)
    # No host can start it now: it waits where the batch queue is shortest, and of two
    # equal queues, at the host its system prompt last went to.
    assert batch_on(crossbar) == {"titan": 2, "atlas": 3}
    ask(crossbar, "bulk", "record 5", system=summarize)
    assert batch_on(crossbar) == {"titan": 3, "atlas": 3}  # the shorter queue first


@pytest_twisted.ensureDeferred
async def test_a_batch_request_in_a_session_runs_beside_it_and_never_moves_its_lease():
    crossbar = start(ROUTES, hosts=HOSTS, parallel=3)
    for name in HOSTS:
        crossbar.net.on_request[name] = lambda host: host.answer(ANSWER)
    session = {"X-Session-Id": "s-42"}
    assert ask(crossbar, "chat", "let us talk", **session).status == 200
    [lease] = crossbar.parts.table.snapshot()
    crossbar.net.clock.advance(5)
    summary = ask(crossbar, "chat", "summarize us", **session, **{"X-Crossbar-Class": "batch"})
    assert summary.status == 200 and crossbar.store.usage[-1].host == lease.host
    [after] = crossbar.parts.table.snapshot()
    assert (after.host, after.last_used) == (lease.host, lease.last_used)  # not even touched
    await crossbar.parts.hosts.drain(lease.host)
    summary = ask(crossbar, "chat", "again", **session, **{"X-Crossbar-Class": "batch"})
    assert summary.status == 200 and crossbar.store.usage[-1].host != lease.host
    assert crossbar.parts.table.snapshot() == [after]  # the conversation stays at home
