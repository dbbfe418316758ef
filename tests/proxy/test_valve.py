"""The valve, told as stories on the in-memory network: fake llama-servers whose prefill and
decode take the net's clock time, conversations that take turns, and time that moves only
when the story says. Two hosts with one slot each; each reply is 20 tokens at 20 tokens a
second (1 s); each uncached prompt token costs 2 ms of prefill."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.memnet import CHAT_PATH, MODEL, Client, Crossbar, Net, _unchunk, start

PACE = {"parallel": 1, "tokens_per_second": 20, "prefill_ms_per_token": 2, "reply_tokens": 20}
ROUTE = {"convo": {"hosts": ["titan", "atlas"]}}


def fleet(routes: dict[str, Any] = ROUTE, hosts: tuple[str, ...] = ("titan", "atlas"), **kw):
    net = Net()
    for name in hosts:
        net.serve(name, **PACE)
    return start(routes, hosts=hosts, parallel=1, net=net, **kw)


def opening(i: int, words: int = 40) -> list[dict[str, str]]:
    """Conversation i's first messages: about `words` tokens of its own."""
    task = " ".join(f"w{i}x{n}" for n in range(words))
    return [{"role": "user", "content": f"Conversation {i}: {task}"}]


def send(crossbar: Crossbar, messages: list[dict[str, str]], path: str = CHAT_PATH) -> Client:
    body = json.dumps({"model": MODEL, "messages": messages}).encode()
    return crossbar.post(path, body)


def done(client: Client) -> bool:
    _, found, body = client.received.partition(b"\r\n\r\n")
    if not found:
        return False
    if client.header(b"transfer-encoding") == b"chunked":
        return body.endswith(b"0\r\n\r\n")
    return len(body) >= int(client.header(b"content-length") or 0)


def until(net: Net, *clients: Client, limit: float = 60.0) -> None:
    """Run the clock until every client has its whole answer."""
    waited = 0.0
    while not all(done(c) for c in clients):
        assert waited < limit, [c.received[:200] for c in clients]
        net.run(0.05)
        waited += 0.05


def answer(client: Client) -> dict[str, Any]:
    body = client.received.split(b"\r\n\r\n", 1)[1]
    if client.header(b"transfer-encoding") == b"chunked":
        body = _unchunk(body)
    return json.loads(body)


class Conversation:
    """One agent conversation: each turn sends the history, then appends the reply."""

    def __init__(self, crossbar: Crossbar, i: int, words: int = 40) -> None:
        self.crossbar, self.messages = crossbar, opening(i, words)
        self.turns = 0

    def send(self) -> Client:
        if self.turns:
            self.messages.append({"role": "user", "content": f"Next step {self.turns}."})
        self.turns += 1
        return send(self.crossbar, self.messages)

    def took(self, client: Client) -> tuple[str, str]:
        """Keep the reply; (host, lease) the answer says."""
        reply = answer(client)["choices"][0]["message"]["content"]
        self.messages.append({"role": "assistant", "content": reply})
        return client.header(b"X-Crossbar-Host").decode(), client.header(
            b"X-Crossbar-Lease"
        ).decode()

    def turn(self) -> tuple[str, str]:
        client = self.send()
        until(self.crossbar.net, client)
        return self.took(client)


def spread(crossbar: Crossbar, n: int = 4, words: int = 40) -> list[Conversation]:
    """`n` conversations started one at a time: the chooser spreads them over the hosts."""
    conversations = [Conversation(crossbar, i, words) for i in range(n)]
    hosts = [c.turn()[0] for c in conversations]
    assert hosts == ["titan", "atlas"] * (n // 2)
    return conversations


def busy_moves(crossbar: Crossbar) -> list[Any]:
    return [e for e in crossbar.store.events if e.reason == "busy"]


def test_a_turn_facing_a_wait_longer_than_its_prefill_elsewhere_moves_then_stays():
    crossbar = fleet()
    a, _, b, _ = spread(crossbar)  # a and b on titan
    first, second = a.send(), b.send()  # at once: b waits for a's 1 s reply
    until(crossbar.net, first, second)
    assert a.took(first) == ("titan", "reused")
    assert b.took(second) == ("atlas", "moved")
    (move,) = busy_moves(crossbar)
    assert (move.from_host, move.to_host) == ("titan", "atlas")
    # It waited for nothing: its re-prefill on idle atlas began at once.
    assert second.header(b"X-Crossbar-Queue-Ms") == b"0"
    assert b.turn() == ("atlas", "reused")  # it stays on its new host
    assert b.turn() == ("atlas", "reused")
    _, metrics = crossbar.admin("GET", "/metrics")  # the operator sees it, by its reason
    assert 'crossbar_lease_moves_total{reason="busy"} 1.0' in metrics


def test_a_batch_turn_waits_for_its_home_host_and_never_moves_its_lease():
    # The same turns as above, b's marked batch (OpenAI's flex tier): bulk work has no
    # person waiting, so it never moves a conversation off its warm host.
    crossbar = fleet()
    a, _, b, _ = spread(crossbar)
    first = a.send()
    b.messages.append({"role": "user", "content": "Next step."})
    body = {"model": MODEL, "messages": b.messages, "service_tier": "flex"}
    second = crossbar.post(CHAT_PATH, json.dumps(body).encode())
    until(crossbar.net, first, second)
    assert second.header(b"X-Crossbar-Class") == b"batch"
    assert b.took(second) == ("titan", "reused")
    assert busy_moves(crossbar) == []


def test_a_long_conversation_waits_for_its_warm_host():
    crossbar = fleet()
    a, _, b, _ = spread(crossbar, words=1500)  # re-prefilling b elsewhere: about 3 s
    first, second = a.send(), b.send()
    until(crossbar.net, first, second)
    assert a.took(first) == ("titan", "reused")
    assert b.took(second) == ("titan", "reused")
    assert int(second.header(b"X-Crossbar-Queue-Ms")) >= 900  # it waited a's reply out
    assert busy_moves(crossbar) == []


def contend(crossbar: Crossbar, rounds: int = 10) -> None:
    """Three conversations, two of them busy at once in every round, the pair changing each
    round: whichever host the two share, the other often idles."""
    a, c, b = [Conversation(crossbar, i) for i in range(3)]
    assert [x.turn()[0] for x in (a, c, b)] == ["titan", "atlas", "titan"]
    for x, y in ([(a, b), (b, c), (a, c)] * rounds)[:rounds]:
        clients = [x.send(), y.send()]
        until(crossbar.net, *clients)
        x.took(clients[0])
        y.took(clients[1])


def test_twenty_contended_turns_never_ping_pong():
    crossbar = fleet()
    contend(crossbar)
    moved = [m.fp for m in busy_moves(crossbar)]
    assert moved and len(set(moved)) == len(moved)  # some moved, none twice


def test_without_a_hold_the_same_turns_would_ping_pong():
    crossbar = fleet({"convo": {"hosts": ["titan", "atlas"], "valve_hold": "0s"}})
    contend(crossbar)
    moved = [m.fp for m in busy_moves(crossbar)]
    assert len(set(moved)) < len(moved)


@pytest.mark.parametrize(
    "routes, why",
    [
        ({"convo": {"hosts": ["titan", "atlas"], "affinity": "route"}}, "one lease for all"),
        ({"convo": {"hosts": ["titan", "atlas"], "queue": False}}, "never queues"),
        ({"convo": {"hosts": ["titan", "atlas"], "valve": False}}, "valve off"),
    ],
)
def test_routes_whose_valve_cannot_open_never_move(routes, why):
    crossbar = fleet(routes)
    conversations = [Conversation(crossbar, i) for i in range(4)]
    homes = [c.turn()[0] for c in conversations]
    a, b = conversations[0], conversations[homes.index("titan", 1)]  # two on titan
    first, second = a.send(), b.send()
    until(crossbar.net, first, second)
    assert busy_moves(crossbar) == [], why
    assert a.took(first)[0] == b.took(second)[0] == "titan"


def test_a_pinned_route_never_moves():
    crossbar = fleet()
    a, _, b, _ = spread(crossbar)
    status, _ = crossbar.admin("PUT", "/api/routes/convo/pin", {"host": "titan"})
    assert status == 200
    first, second = a.send(), b.send()
    until(crossbar.net, first, second)
    assert a.took(first) == ("titan", "pinned") and b.took(second) == ("titan", "pinned")
    assert busy_moves(crossbar) == []


def test_a_draining_candidate_is_never_taken():
    crossbar = fleet()
    a, _, b, _ = spread(crossbar)
    assert crossbar.admin("POST", "/api/hosts/atlas/drain")[0] == 200
    first, second = a.send(), b.send()
    until(crossbar.net, first, second)
    assert b.took(second) == ("titan", "reused")
    assert busy_moves(crossbar) == []


def test_an_unhealthy_candidate_is_never_taken():
    crossbar = fleet()
    a, _, b, _ = spread(crossbar)
    crossbar.parts.hosts.passive_failure("atlas", "refused", ("titan", "atlas"))
    assert not crossbar.parts.hosts.healthy("atlas")
    first, second = a.send(), b.send()
    until(crossbar.net, first, second)
    assert b.took(second) == ("titan", "reused")
    assert busy_moves(crossbar) == []


def test_a_turn_judged_again_while_it_waits_moves_when_a_host_frees():
    # A wary valve (twice the cost elsewhere, no slack) makes the story's numbers plain.
    crossbar = fleet(
        {"convo": {"hosts": ["titan", "atlas"], "valve_margin": 2, "valve_slack": "0s"}}
    )
    a, c, b, _ = spread(crossbar)  # a, b on titan; c on atlas
    third = c.send()
    crossbar.net.run(0.5)
    # b queues behind a's 1 s reply; atlas has half of c's reply to go, then b's 0.2 s of
    # prefill: 2 x (0.5 + 0.2) > 1, so b stays.
    first, second = a.send(), b.send()
    crossbar.net.run(0.1)
    assert crossbar.parts.limiter.queued("titan", MODEL) == 1
    assert busy_moves(crossbar) == []
    # c's reply ends: atlas frees with half of a's reply to come: 0.5 > 2 x 0.2, b moves.
    until(crossbar.net, first, second, third)
    assert b.took(second) == ("atlas", "moved")
    assert len(busy_moves(crossbar)) == 1
    assert 400 <= int(second.header(b"X-Crossbar-Queue-Ms")) <= 600


def test_two_instances_on_one_store_never_move_one_conversation_twice():
    net = Net()
    hosts = ("titan", "atlas", "vega")
    for name in hosts:
        net.serve(name, **PACE)
    routes = {
        "convo": {"hosts": list(hosts)},
        # Routes of one host each: their turns keep a host busy where the story says.
        "on-titan": {"hosts": ["titan"]},
        "on-atlas": {"hosts": ["atlas"]},
    }
    one = start(routes, hosts=hosts, parallel=1, net=net)
    a = Conversation(one, 0)
    assert a.turn()[0] == "titan"
    # A second instance on the same store loads the conversation's lease on titan; the same
    # conversation's next turns reach both instances at once.
    two = start(routes, hosts=hosts, parallel=1, net=net, store=one.store)
    b = Conversation(two, 0)
    b.messages = list(a.messages)

    def keep_busy(crossbar: Crossbar, route: str, i: int) -> Client:
        return send(crossbar, opening(i), f"/r/{route}/v1/chat/completions")

    # Each instance has titan busy with a turn of its own; the second has atlas busy too, so
    # each would move the conversation elsewhere: the first to atlas, the second to vega.
    busy = [keep_busy(one, "on-titan", 7), keep_busy(two, "on-titan", 8)]
    busy.append(keep_busy(two, "on-atlas", 9))
    net.run(0.01)
    turns = [a.send(), b.send()]
    until(net, *busy, *turns)
    moves = [e for e in one.store.events if e.reason == "busy"]
    assert len(moves) == 1, moves  # one store, one move: the other instance adopted it
    (move,) = moves
    assert (move.from_host, move.to_host) == ("titan", "atlas")
    assert [c.header(b"X-Crossbar-Host") for c in turns] == [b"atlas", b"atlas"]
    assert one.store.rows[a_key(one)].host == "atlas"
    # The second instance had chosen vega and taken its slot; the store said the
    # conversation had gone to atlas, so it gave the slot back and followed it there.
    (vega,) = [s for s in two.parts.limiter.snapshot() if s.host == "vega"]
    assert (vega.admitted, vega.in_flight) == (1, 0)
    assert net.fakes["vega"].counters.completions == []


def a_key(crossbar: Crossbar) -> Any:
    (key,) = [k for k in crossbar.store.rows if k.route == "convo"]
    return key


def test_the_hosts_pace_queued_prefill_and_expected_wait_are_shown():
    crossbar = fleet()
    a, _, b, _ = spread(crossbar)
    _, hosts = crossbar.admin("GET", "/api/hosts")
    (titan,) = [m for h in hosts["hosts"] if h["name"] == "titan" for m in h["models"]]
    # Learned from the fakes' own timings: 2 ms a prompt token, 20 output tokens a second.
    assert (titan["prefill_tokens_per_second"], titan["decode_tokens_per_second"]) == (500, 20)
    assert titan["rates_source"] == "learned"
    assert (titan["queued_prefill_tokens"], titan["expected_wait_seconds"]) == (0, 0)
    # A long turn holds titan's slot; a second waits behind it with its whole prompt cold.
    crossbar.parts.limiter.rates.learn_output("convo", 20)
    long_turn = Conversation(crossbar, 5, words=400)
    long_turn.messages[0]["content"] += " (on titan)"
    status, _ = crossbar.admin("PUT", "/api/routes/convo/pin", {"host": "titan"})
    assert status == 200
    first, second = a.send(), long_turn.send()
    crossbar.net.run(0.1)
    _, hosts = crossbar.admin("GET", "/api/hosts")
    (titan,) = [m for h in hosts["hosts"] if h["name"] == "titan" for m in h["models"]]
    assert titan["queued"] == 1 and titan["queued_prefill_tokens"] > 400
    # a's reply has 0.9 s to go, then the waiter's prefill and its 20 tokens.
    waiter = titan["queued_prefill_tokens"] / 500 + 1.0
    assert titan["expected_wait_seconds"] == pytest.approx(0.9 + waiter, abs=0.05)
    _, metrics = crossbar.admin("GET", "/metrics")
    labels = '{host="titan",model="qwen-coder"}'
    assert f"crossbar_host_prefill_tokens_per_second{labels} 500.0" in metrics
    assert f"crossbar_host_decode_tokens_per_second{labels} 20.0" in metrics
    assert f"crossbar_queued_prefill_tokens{labels} {titan['queued_prefill_tokens']}.0" in metrics
    assert f"crossbar_expected_wait_seconds{labels}" in metrics
    until(crossbar.net, first, second)
    assert b.turn()[0] == "titan"
