"""Request classes on the request path (issue 48), told on the in-memory network: where a
request's class comes from (its header, its `service_tier`, Claude Code's own hint, its key,
its route), how a key's `max_class` lowers it, what the answer and the usage say of it, and a
batch flood that leaves a slot free on every host for the turn that arrives."""

from __future__ import annotations

import json
from typing import Any

import pytest
from twisted.logger import globalLogPublisher

from crossbar.app.logs import log_request
from tests.support.memnet import MODEL, Client, Crossbar, start

TEAM, CI = "sk-team-0123456789abcdef", "sk-ci-0123456789abcdef00"
ROUTES = {
    "convo": {"hosts": ["titan", "atlas"], "default_model": MODEL, "auth": "keys"},
    "bulk": {"hosts": ["titan", "atlas"], "default_model": MODEL, "class": "batch"},
}
KEYS = {
    "team": {"secret": TEAM, "routes": ["convo"]},
    "ci": {"secret": CI, "routes": ["convo"], "class": "batch", "max_class": "batch"},
}
ANSWER = json.dumps({"id": "c1", "choices": [], "usage": {"prompt_tokens": 5}}).encode()


def fleet(parallel: int = 2) -> Crossbar:
    crossbar = start(ROUTES, keys=KEYS, parallel=parallel)
    for name in ("titan", "atlas"):
        crossbar.net.on_request[name] = lambda host: host.answer(ANSWER)
    return crossbar


def ask(
    crossbar: Crossbar,
    secret: str | None = TEAM,
    route: str = "convo",
    body: dict[str, Any] | None = None,
    path: str = "/v1/chat/completions",
    **headers: str,
) -> Client:
    if secret is not None:
        headers["Authorization"] = f"Bearer {secret}"
    sent = body or {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    return crossbar.post(f"/r/{route}{path}", json.dumps(sent).encode(), **headers)


def class_of(client: Client) -> str:
    assert client.status == 200, client.received[-300:]
    return (client.header(b"X-Crossbar-Class") or b"").decode()


@pytest.mark.parametrize(
    ("headers", "tier", "expected"),
    [
        ({}, None, "standard"),  # the route's default
        ({"X-Crossbar-Class": "batch"}, None, "batch"),
        ({"X-Crossbar-Class": "Interactive"}, "flex", "interactive"),  # the header first
        ({}, "flex", "batch"),
        ({}, "priority", "interactive"),
        ({}, "auto", "standard"),
        ({"x-claude-code-request-class": "main"}, None, "interactive"),
        ({"x-claude-code-request-class": "workflow"}, None, "standard"),
        ({"x-claude-code-request-class": "main"}, "flex", "batch"),  # the body before hints
    ],
)
def test_a_request_says_its_class_by_header_service_tier_or_its_clients_hint(
    headers, tier, expected
):
    crossbar = fleet()
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    if tier is not None:
        body["service_tier"] = tier
    assert class_of(ask(crossbar, body=body, **headers)) == expected
    assert crossbar.store.usage[-1].request_class == expected


def test_a_keys_class_is_its_requests_and_max_class_lowers_what_they_claim():
    crossbar = fleet()
    assert class_of(ask(crossbar, CI)) == "batch"
    assert class_of(ask(crossbar, CI, **{"X-Crossbar-Class": "interactive"})) == "batch"
    assert class_of(ask(crossbar, TEAM, **{"X-Crossbar-Class": "interactive"})) == "interactive"


def test_a_routes_class_is_its_requests_when_nothing_else_says():
    crossbar = fleet()
    assert class_of(ask(crossbar, None, route="bulk")) == "batch"
    assert class_of(ask(crossbar, None, route="bulk", **{"X-Crossbar-Class": "standard"})) == (
        "standard"
    )


def test_a_class_that_is_no_class_is_a_400_in_the_callers_dialect_and_changes_nothing():
    crossbar = fleet()
    client = ask(crossbar, **{"X-Crossbar-Class": "urgent"})
    assert client.status == 400
    error = json.loads(client.received.split(b"\r\n\r\n", 1)[1])["error"]
    assert "X-Crossbar-Class must be" in error["message"]
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    client = ask(crossbar, body=body, path="/v1/messages", **{"X-Crossbar-Class": "urgent"})
    assert client.status == 400
    assert json.loads(client.received.split(b"\r\n\r\n", 1)[1])["type"] == "error"
    assert crossbar.parts.table.snapshot() == []  # no lease for what was not understood


def test_a_batch_flood_leaves_a_slot_free_on_every_host_for_the_next_turn():
    crossbar = fleet(parallel=3)
    for name in ("titan", "atlas"):
        crossbar.net.on_request[name] = lambda host: None  # every answer is still coming
    limiter = crossbar.parts.limiter
    for i in range(12):
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"item {i}"}]}
        assert ask(crossbar, None, route="bulk", body=body).status is None
    held = {h: limiter.in_flight(h, MODEL) for h in ("titan", "atlas")}
    assert held == {"titan": 2, "atlas": 2}  # every slot but one, on each host
    queued = limiter.queued("titan", MODEL) + limiter.queued("atlas", MODEL)
    assert queued == 8
    ask(crossbar, TEAM, **{"X-Crossbar-Class": "interactive"})  # a turn arrives
    after = {h: limiter.in_flight(h, MODEL) for h in ("titan", "atlas")}
    assert sorted(after.values()) == [2, 3]  # it took the free slot at once, queueing nowhere
    assert limiter.queued("titan", MODEL) + limiter.queued("atlas", MODEL) == queued


def test_the_request_line_says_a_class_other_than_standard():
    crossbar = fleet()
    ask(crossbar, CI)
    ask(crossbar, TEAM)
    seen: list[str] = []

    def keep(event: dict[str, Any]) -> None:
        if event.get("log_namespace") == "crossbar.request":
            seen.append(event["line"])

    globalLogPublisher.addObserver(keep)
    try:
        for row in crossbar.store.usage[-2:]:
            log_request(row)
    finally:
        globalLogPublisher.removeObserver(keep)
    assert " class=batch" in seen[0] and "class=" not in seen[1]


YIELDING = {
    "convo": {"hosts": ["titan"], "default_model": MODEL},
    "bulk": {"hosts": ["titan"], "default_model": MODEL, "class": "batch",
             "batch_yield_after": "1s"},
}  # fmt: skip


def held_fleet() -> tuple[Crossbar, list[Any]]:
    """One host of one slot whose answers wait until the story gives them."""
    crossbar = start(YIELDING, hosts=("titan",), parallel=1)
    held: list[Any] = []
    crossbar.net.on_request["titan"] = held.append
    return crossbar, held


@pytest.mark.parametrize("turn_class", ["interactive", "standard"])
def test_a_batch_request_is_stopped_for_a_turn_that_waited_and_runs_again_first(turn_class):
    crossbar, held = held_fleet()
    item = ask(crossbar, None, route="bulk")  # takes the one slot; its answer is coming
    assert len(held) == 1 and item.status is None
    turn = ask(crossbar, None, **{"X-Crossbar-Class": turn_class})
    crossbar.net.run(0.9)
    assert turn.status is None and not held[0].lost  # within the bound: it waits
    crossbar.net.run(0.2)
    assert held[0].lost  # the batch request's host connection closed: the host stops
    assert len(held) == 2  # the turn went out on the freed slot
    held[1].answer(ANSWER)
    crossbar.net.flush()
    assert turn.status == 200 and item.status is None  # the batch client saw nothing
    crossbar.net.run(11)  # the turns' window passes: the batch request goes again
    assert len(held) == 3
    held[2].answer(ANSWER)
    crossbar.net.flush()
    assert item.status == 200 and item.received.count(b"HTTP/1.1") == 1
    assert crossbar.parts.limiter._slots[("titan", MODEL)].stopped == 1


def test_a_streamed_batch_request_is_never_stopped():
    crossbar, held = held_fleet()
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    ask(crossbar, None, route="bulk", body=body)
    turn = ask(crossbar, None, **{"X-Crossbar-Class": "interactive"})
    crossbar.net.run(5)
    assert len(held) == 1 and not held[0].lost and turn.status is None


def test_a_stopped_batch_run_is_charged_to_its_key_beside_the_run_that_answered():
    routes = {name: {**route, "auth": "keys"} for name, route in YIELDING.items()}
    keys = {"ci": {"secret": CI, "routes": ["convo", "bulk"], "class": "batch"}}
    crossbar = start(routes, hosts=("titan",), parallel=1, keys=keys)
    held: list[Any] = []
    crossbar.net.on_request["titan"] = held.append
    meter, ci = crossbar.parts.tenants.meter, crossbar.parts.tenants.book.get("ci")
    item = ask(crossbar, CI, route="bulk")
    ask(crossbar, CI, **{"X-Crossbar-Class": "interactive"})
    crossbar.net.run(1.1)
    assert held[0].lost  # stopped after 1.1 s on the host
    held[1].answer(ANSWER)
    crossbar.net.run(11)
    held[2].answer(ANSWER)
    crossbar.net.flush()
    assert item.status == 200
    used = meter.status(ci, crossbar.net.clock.seconds())["tokens_today"]
    answered = 5 + 5  # the turn's answer and the item's, 5 prompt tokens each
    # The stopped run read its prompt and wrote for about a second at the default pace of 30
    # tokens a second (this host never taught crossbar its own): it is paid for too.
    assert used - answered >= 30
