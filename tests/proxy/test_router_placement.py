"""Placement that knows which models router-mode hosts have loaded, told on the in-memory
network with fake routers that load on demand and unload the least recently used idle model at
their `models_max`: models settle one host each, a loaded model is never loaded again elsewhere
while it has a slot, a conversation follows its unloaded model, a host asked for more models
than it holds serves them in batches, a router's swap answers never reach a client, and the
operator loads and unloads through crossbar."""

from __future__ import annotations

import json
from typing import Any

from crossbar.leases import LOADED
from crossbar.testing.fakerouter import FakeRouter
from crossbar.testing.fakestate import FakeConfig
from tests.support.memnet import CHAT_PATH, MODEL, Client, Crossbar, Net, _unchunk, chat, start

LOAD = 2.0  # seconds a fake router takes to load a model
TURN = 1.0  # seconds a 10-token answer takes at 10 tokens a second


def fleet(
    models: tuple[str, ...] = ("coder", "chat"),
    hosts: tuple[str, ...] = ("h0", "h1"),
    routes: dict[str, Any] | None = None,
    table: dict[str, Any] | None = None,
    **knobs: Any,
) -> tuple[Crossbar, dict[str, FakeRouter]]:
    """Router-mode hosts `hosts` serving `models` (2 slots each, 10 tokens a second), one
    model at a time unless `knobs` say otherwise, and crossbar in front (each host's table
    with `table` besides), probed once."""
    net = Net()
    knobs = {"models_max": 1, "load_delay": LOAD, **knobs}
    routers = {
        h: net.serve_router(
            h, {m: FakeConfig(parallel=2, tokens_per_second=10) for m in models}, **knobs
        )
        for h in hosts
    }
    routes = routes or {"convo": {"hosts": list(hosts)}}
    tables = {h: {"models": "discover", **(table or {})} for h in hosts}
    crossbar = start(routes, net=net, host_tables=tables)
    probe(crossbar)
    return crossbar, routers


def probe(crossbar: Crossbar) -> None:
    done: list[Any] = []
    crossbar.parts.hosts.probe_all().addBoth(done.append)
    crossbar.net.run(0.5)
    assert done, "a probe round over the in-memory network finishes"


def turn(crossbar: Crossbar, model: str, conversation: int, turns: int = 1) -> Client:
    """The next turn of `conversation` (its opening names it; `turns` user messages so far)."""
    messages: list[dict[str, str]] = [{"role": "system", "content": "You help."}]
    messages.append({"role": "user", "content": f"Conversation {conversation}: hello."})
    for k in range(1, turns):
        messages += [{"role": "assistant", "content": "Sure."},
                     {"role": "user", "content": f"More, part {k}."}]  # fmt: skip
    body = {"model": model, "messages": messages, "max_tokens": 10}
    return crossbar.post(CHAT_PATH, json.dumps(body).encode())


def host_of(client: Client) -> str:
    assert client.status == 200, client.received[-300:]
    return (client.header(b"X-Crossbar-Host") or b"").decode()


def loads(routers: dict[str, FakeRouter]) -> dict[str, int]:
    return {name: r.loads for name, r in routers.items()}


def body_of(client: Client) -> Any:
    body = client.received.split(b"\r\n\r\n", 1)[1]
    if client.header(b"transfer-encoding") == b"chunked":
        body = _unchunk(body)
    return json.loads(body)


def test_two_models_on_two_one_model_hosts_settle_on_one_host_each():
    crossbar, routers = fleet()
    net = crossbar.net
    placed: dict[str, set[str]] = {"coder": set(), "chat": set()}
    for n in range(4):  # begun one at a time, the models interleaved
        for model in ("coder", "chat"):
            client = turn(crossbar, model, n)
            net.run(LOAD + TURN + 1)
            placed[model].add(host_of(client))
    # Then every conversation takes two more turns, three at a time.
    for k in (2, 3):
        for batch in range(0, 8, 3):
            sent = [turn(crossbar, m, n, k) for n in range(4) for m in ("coder", "chat")]
            sent = sent[batch : batch + 3]
            net.run(3 * (TURN + 1))
            for client in sent:
                host_of(client)
    assert placed["coder"] != placed["chat"] and all(len(h) == 1 for h in placed.values())
    assert loads(routers) == {"h0": 1, "h1": 1}  # the floor: each host loads its model once


def test_a_new_conversation_goes_where_its_model_is_loaded_not_to_a_free_place():
    crossbar, routers = fleet(models_max=2)
    net = crossbar.net
    first = turn(crossbar, "coder", 1)
    net.run(LOAD + TURN + 1)
    home = host_of(first)
    # h1 holds nothing and has no lease; the host with coder loaded has a free slot.
    second = turn(crossbar, "coder", 2)
    net.run(TURN + 1)
    assert host_of(second) == home
    assert sum(loads(routers).values()) == 1


def test_a_conversation_whose_model_was_unloaded_follows_it_to_a_host_that_has_it():
    crossbar, routers = fleet(models_max=2)
    net = crossbar.net
    first = turn(crossbar, "coder", 1)
    net.run(LOAD + TURN + 1)
    home = host_of(first)
    other = "h1" if home == "h0" else "h0"
    status, answer = crossbar.admin("POST", f"/api/hosts/{other}/models/coder/load")
    assert (status, answer["state"]) == (200, "loading")
    status, answer = crossbar.admin("POST", f"/api/hosts/{home}/models/coder/unload")
    assert (status, answer["state"]) == (200, "unloaded")
    net.run(LOAD + 1)
    assert routers[home].status["coder"] == "unloaded"
    assert routers[other].status["coder"] == "loaded"
    again = turn(crossbar, "coder", 1, turns=2)
    net.run(TURN + 1)
    # Its cache on its host is gone with the model: it goes to the loaded one, no load.
    assert host_of(again) == other and again.header(b"X-Crossbar-Lease") == b"new"
    moved = crossbar.store.events[-1]
    assert (moved.reason, moved.from_host, moved.to_host) == ("unloaded", home, other)
    assert loads(routers) == {home: 1, other: 1}


def test_three_models_on_one_host_that_holds_one_are_served_in_batches_within_the_bound():
    bound = 5.0
    crossbar, routers = fleet(models=("coder", "chat", "vision"), hosts=("h0",),
                              table={"swap_after": f"{bound:g}s"})  # fmt: skip
    net = crossbar.net
    # Each model's agents keep sending: two conversations of each, all at once, six turns each,
    # each next turn sent the moment the last is answered.
    waiting = {(m, n): turn(crossbar, m, n) for m in ("coder", "chat", "vision") for n in range(2)}
    sent = dict.fromkeys(waiting, 0.0)
    done: dict[tuple[str, int], int] = {}
    longest = 0.0
    for _ in range(1200):
        net.run(0.1)
        for key, client in list(waiting.items()):
            if client.status is None:
                continue
            assert client.status == 200, client.received[-300:]
            longest = max(longest, net.clock.seconds() - sent[key])
            done[key] = done.get(key, 0) + 1
            del waiting[key]
            if done[key] < 6:
                waiting[key] = turn(crossbar, key[0], key[1], done[key] + 1)
                sent[key] = net.clock.seconds()
        if not waiting:
            break
    assert not waiting and sum(done.values()) == 36
    # Turn by turn that is 36 loads; in batches of the bound, a handful. No turn waits past the
    # other two models' batches (their bound, then their running turns) and its own load.
    loaded = [model for _, what, model in routers["h0"].history if what == "load"]
    assert 3 <= len(loaded) <= 12, loaded
    assert set(loaded) == {"coder", "chat", "vision"}
    assert longest <= 2 * (bound + TURN + LOAD) + TURN + 1, longest


def test_a_routers_answer_that_its_model_is_moving_never_reaches_the_client():
    crossbar, routers = fleet(hosts=("h0",), unload_delay=1.0, swap_errors=True)
    net = crossbar.net
    first = turn(crossbar, "coder", 1)
    net.run(LOAD + TURN + 1)
    host_of(first)
    # The operator unloads coder; a turn arriving while its server stops gets the router's
    # 500 proxy error, which crossbar waits out and sends again.
    status, _ = crossbar.admin("POST", "/api/hosts/h0/models/coder/unload")
    assert status == 200
    again = turn(crossbar, "coder", 1, turns=2)
    net.run(1.0 + LOAD + TURN + 2)
    assert host_of(again) == "h0"
    assert routers["h0"].requests["/v1/chat/completions"] >= 3  # one was answered "moving"


def test_the_operator_loads_and_unloads_a_model_and_the_state_follows():
    crossbar, routers = fleet(hosts=("h0",))
    net = crossbar.net
    status, answer = crossbar.admin("POST", "/api/hosts/h0/models/chat/load")
    assert (status, answer) == (200, {"host": "h0", "model": "chat", "state": "loading"})
    net.run(LOAD + 0.5)
    probe(crossbar)
    hosts = crossbar.admin("GET", "/api/hosts")[1]["hosts"]
    states = {m["name"]: m["state"] for m in hosts[0]["models"]}
    assert states == {"coder": "unloaded", "chat": "loaded"}
    assert hosts[0]["router"]["max_loaded"] == 1 and hosts[0]["router"]["running"] == ["chat"]
    status, answer = crossbar.admin("POST", "/api/hosts/h0/models/chat/unload")
    assert (status, answer["state"]) == (200, "unloaded")
    net.run(0.5)
    assert routers["h0"].status["chat"] == "unloaded"
    events = crossbar.admin("GET", "/api/models/events?host=h0")[1]["events"]
    assert [(e["kind"], e["model"], e["reason"]) for e in events] == [
        ("unload", "chat", "operator"),
        ("load", "chat", "operator"),
    ]
    metrics = crossbar.admin("GET", "/metrics")[1]
    assert 'crossbar_model_loads_total{host="h0",model="chat",reason="operator"} 1.0' in metrics
    assert 'crossbar_host_max_loaded{host="h0"} 1.0' in metrics


def test_the_admin_api_refuses_what_is_no_routers_model():
    crossbar, _ = fleet(hosts=("h0",))
    assert crossbar.admin("POST", "/api/hosts/nope/models/chat/load")[0] == 404
    assert crossbar.admin("POST", "/api/hosts/h0/models/nope/load")[0] == 404
    plain = start({"convo": {"hosts": ["titan"]}}, hosts=("titan",))
    status, answer = plain.admin("POST", "/api/hosts/titan/models/qwen-coder/load")
    assert status == 409 and "not a router-mode host" in answer["error"]["message"]


def test_a_single_model_llama_server_is_placed_as_before():
    crossbar = start({"convo": {"hosts": ["titan", "atlas"]}})
    loaded, gate = crossbar.parts.loaded, crossbar.parts.limiter.gate
    assert loaded is not None and gate is not None
    client = crossbar.post(CHAT_PATH, chat("hello"))
    (host,) = [c for conns in crossbar.net.connections.values() for c in conns]
    host.answer()
    crossbar.net.flush()
    assert client.status == 200
    for name in ("titan", "atlas"):
        # Every model is always loaded there: the tier of old, no gate, nothing to unload.
        assert (loaded.tier(name, MODEL), loaded.crowd(name), loaded.evicts(name, MODEL)) == (
            LOADED, 0, 0,
        )  # fmt: skip
        assert gate.open_models(name) == [] and gate.admits(name, MODEL)
    assert list(crossbar.parts.hosts.model_events) == []
    rows = crossbar.admin("GET", "/api/hosts")[1]["hosts"]
    assert [h["router"] for h in rows] == [None, None]
    assert {m["load_seconds"] for h in rows for m in h["models"]} == {None}
