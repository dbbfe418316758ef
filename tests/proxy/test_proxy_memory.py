"""The proxy rules that hang on timing, told on an in-memory network and a Clock: a client
leaving while its host thinks, a keep-alive race on a pooled connection, a stop's grace."""

from typing import Any

import pytest
from twisted.internet.defer import ensureDeferred

from crossbar.leases.table import Key
from crossbar.wire import relay
from crossbar.wire.pool import QUIET
from tests.support.memnet import MODEL, chat, sse, start
from tests.support.routes import CONVO

ROUTES = CONVO
ALONE = {"convo": {**CONVO["convo"], "resume_attempts": 0}}
CHAT = "/r/convo/v1/chat/completions"


def test_a_client_leaving_while_its_host_thinks_aborts_the_host_and_blames_nobody():
    crossbar = start(ROUTES)
    net, limiter = crossbar.net, crossbar.parts.limiter
    client = crossbar.post(CHAT, chat())
    (upstream,) = net.connections["titan"]
    assert upstream.requests() == 1 and limiter.in_flight("titan", MODEL) == 1
    client.transport.loseConnection()  # the client hangs up before any answer
    net.flush()
    assert upstream.lost  # the host's connection is aborted: its slot frees
    assert limiter.in_flight("titan", MODEL) == 0
    assert crossbar.parts.hosts.healthy("titan")
    assert "atlas" not in net.connections  # not resent for nobody
    (row,) = crossbar.store.usage
    assert (row.status, row.error, row.host) == (499, "client disconnected", "titan")


def test_a_completion_the_host_read_and_closed_on_is_sent_once_and_answered_502():
    crossbar = start(ALONE)  # resume_attempts = 0: the transport's rule alone
    net = crossbar.net
    net.on_request["titan"] = lambda host: host.answer()
    assert crossbar.post(CHAT, chat("one")).status == 200
    assert len(net.connections["titan"]) == 1  # kept alive for the next request
    net.clock.advance(QUIET)  # rested: the next request takes it

    # The host reads the next request and closes without a byte of answer. It may have
    # crashed on it, or closed the idle connection as crossbar reused it: crossbar cannot
    # tell, and a completion is not sent twice on a guess.
    def drop(host):
        host.transport.loseConnection()

    net.on_request["titan"] = drop
    second = crossbar.post(CHAT, chat("one"))
    assert second.status == 502
    assert "closed the connection before answering" in error_of(second)["error"]["message"]
    assert [c.requests() for c in net.connections["titan"]] == [2]  # sent once
    assert crossbar.parts.hosts.healthy("titan")
    assert "atlas" not in net.connections


def test_a_completion_whose_host_closed_before_answering_runs_again_once_on_the_other_host():
    crossbar = start(ROUTES)  # resume_attempts = 1, the default
    net = crossbar.net
    net.on_request["titan"] = lambda host: host.answer()
    assert crossbar.post(CHAT, chat("one")).status == 200
    net.clock.advance(QUIET)
    net.on_request["titan"] = lambda host: host.transport.loseConnection()
    net.on_request["atlas"] = lambda host: host.answer()
    second = crossbar.post(CHAT, chat("one"))
    # Its answer showed the client nothing: it ran again, once, elsewhere; the same host is
    # never asked twice, and nobody is ejected for it.
    assert second.status == 200 and second.header(b"X-Crossbar-Host") == b"atlas"
    assert second.header(b"X-Crossbar-Resumed") == b"1"
    assert [c.requests() for c in net.connections["titan"]] == [2]
    assert [c.requests() for c in net.connections["atlas"]] == [1]
    assert crossbar.parts.hosts.healthy("titan")
    moved = [(e.from_host, e.to_host, e.reason) for e in crossbar.store.events][-1]
    assert moved == ("titan", "atlas", "resumed")  # the conversation went with its answer


@pytest.mark.parametrize(
    ("method", "headers"),
    [("GET", {}), ("POST", {"Idempotency-Key": "turn-7"})],
    ids=["an idempotent method", "an Idempotency-Key"],
)
def test_a_request_that_may_be_repeated_is_retried_once_on_a_fresh_connection(method, headers):
    crossbar = start({"convo": {"hosts": ["titan"], "default_model": MODEL}}, hosts=("titan",))
    net = crossbar.net
    net.on_request["titan"] = lambda host: host.answer()
    assert crossbar.post(CHAT, chat("one")).status == 200
    (pooled,) = net.connections["titan"]
    net.clock.advance(QUIET)

    def drop_then_answer(host):
        if host is pooled:
            host.transport.loseConnection()  # a keep-alive race looks like this
        else:
            host.answer()

    net.on_request["titan"] = drop_then_answer
    path = "/r/convo/slots" if method == "GET" else CHAT
    body = chat("one") if method == "POST" else b""
    client = crossbar.send(method, path, body, headers)
    assert client.status == 200
    assert [c.requests() for c in net.connections["titan"]] == [2, 1]  # once more, fresh
    assert crossbar.parts.hosts.healthy("titan")


def test_a_fresh_connection_refused_moves_the_request_and_marks_the_host_down():
    crossbar = start(ROUTES)
    net = crossbar.net
    net.refusing.add("titan")
    net.on_request["atlas"] = lambda host: host.answer()
    client = crossbar.post(CHAT, chat())
    assert client.status == 200 and client.header(b"X-Crossbar-Host") == b"atlas"
    assert not crossbar.parts.hosts.healthy("titan")
    reasons = [(e.reason, e.from_host, e.to_host) for e in crossbar.store.events]
    assert reasons == [("new", "", "titan"), ("unhealthy", "titan", "atlas")]


def test_a_client_leaving_during_the_hosts_name_lookup_is_not_a_connect_failure():
    # Twisted reports a connect cancelled during its name lookup as DNSLookupError; taken at
    # its word, that marked a healthy host down and resent the request for nobody.
    crossbar = start(ROUTES)
    net = crossbar.net
    net.stall.add("titan")
    net.stall.add("atlas")
    client = crossbar.post(CHAT, chat())
    assert net.names.asked == ["titan"]
    client.transport.loseConnection()
    net.flush()
    assert crossbar.parts.hosts.healthy("titan")
    assert net.names.asked == ["titan"]  # nothing was resent to atlas
    assert crossbar.parts.limiter.in_flight("titan", MODEL) == 0
    (row,) = crossbar.store.usage
    assert (row.status, row.error) == (499, "client disconnected")


def test_a_stop_waits_out_the_grace_then_closes_what_is_left_with_a_shutdown_row():
    crossbar = start(ROUTES)
    net, proxy = crossbar.net, crossbar.sites.resource
    held = crossbar.post(CHAT, chat("held"))  # titan never answers this one
    net.on_request["atlas"] = lambda host: None
    answered_later = crossbar.post(CHAT, chat("answered later"))
    (slow,) = net.connections["atlas"]
    assert proxy.running == 2
    drained = []
    ensureDeferred(proxy.drain(30)).addCallback(drained.append)
    net.clock.advance(10)
    slow.answer()  # one finishes within the grace
    net.flush()
    assert answered_later.status == 200 and proxy.running == 1
    net.clock.advance(19.9)
    net.flush()
    assert drained == [] and not held.lost  # still within the grace period
    net.clock.advance(0.1)
    net.flush()
    assert drained == [1]  # one was aborted
    assert held.lost and held.received == b""  # its connection is closed, nothing sent
    assert net.connections["titan"][0].lost  # and the host's request aborted
    rows = {row.fp: row for row in crossbar.store.usage}
    errors = sorted((row.status, row.error) for row in rows.values())
    assert errors == [(200, ""), (503, "shutdown")]
    assert crossbar.parts.limiter.in_flight("titan", MODEL) == 0


def test_a_stop_with_nothing_running_returns_at_once():
    crossbar = start(ROUTES)
    crossbar.net.on_request["titan"] = lambda host: host.answer()
    assert crossbar.post(CHAT, chat()).status == 200
    drained = []
    ensureDeferred(crossbar.sites.resource.drain(30)).addCallback(drained.append)
    assert drained == [0]


THREE = {"convo": {"hosts": ["titan", "atlas", "nova"], "default_model": MODEL}}


def error_of(client) -> dict:
    import json

    return json.loads(client.received.split(b"\r\n\r\n", 1)[1])


def test_a_request_that_breaks_every_host_it_reaches_gets_502_and_ejects_no_one():
    crossbar = start(ROUTES)
    net, hosts = crossbar.net, crossbar.parts.hosts
    net.on_request["titan"] = lambda host: host.answer()
    assert crossbar.post(CHAT, chat("warm up")).status == 200  # leaves a pooled connection

    def crash(host):
        host.transport.abortConnection()

    net.on_request["titan"] = net.on_request["atlas"] = crash
    net.clock.advance(QUIET)
    client = crossbar.post(CHAT, chat("warm up"))  # same conversation: titan
    assert client.status == 502
    error = error_of(client)["error"]
    assert error["type"] == "api_error" and "atlas" in error["message"]
    # On the pooled connection, once: not again fresh; then run again once on the other host
    # (resume_attempts = 1), and no more: two hosts at most, whatever it breaks.
    assert [c.requests() for c in net.connections["titan"]] == [2]
    assert [c.requests() for c in net.connections["atlas"]] == [1]
    assert hosts.healthy("titan") and hosts.healthy("atlas")
    net.on_request["atlas"] = lambda host: host.answer()
    assert crossbar.post(CHAT, chat("another conversation")).status == 200


def test_a_request_is_tried_on_two_hosts_at_most():
    crossbar = start(THREE, hosts=("titan", "atlas", "nova"))
    net = crossbar.net
    net.refusing |= {"titan", "atlas", "nova"}
    client = crossbar.post("/r/convo/v1/chat/completions", chat())
    assert client.status == 502 and "atlas" in error_of(client)["error"]["message"]
    hosts = crossbar.parts.hosts
    assert [hosts.healthy(h) for h in ("titan", "atlas", "nova")] == [False, False, True]


def test_the_last_healthy_host_of_a_route_is_not_ejected_by_a_refused_connect():
    crossbar = start(ROUTES)
    net, hosts = crossbar.net, crossbar.parts.hosts
    net.refusing |= {"titan", "atlas"}
    client = crossbar.post(CHAT, chat())  # titan refuses, is ejected; atlas refuses, is not
    assert client.status == 502
    assert not hosts.healthy("titan") and hosts.healthy("atlas")
    net.refusing.clear()
    net.on_request["atlas"] = lambda host: host.answer()
    assert crossbar.post(CHAT, chat("next")).status == 200  # the route still has a host


GARBAGE = [
    (b"HELLO WORLD\r\n\r\n", "status code"),
    (b"HTTP/1.1 abc OK\r\nContent-Length: 0\r\n\r\n", "status"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", "bad response head"),
    (b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", "more than 100"),
    (b"HTTP/1.1 200 OK\r\nX-Big: " + b"x" * 70000 + b"\r\n\r\n", "64 KiB"),
]


@pytest.mark.parametrize(("answer", "said"), GARBAGE, ids=[g[1] for g in GARBAGE])
def test_a_host_answering_something_that_is_not_http_gets_502_bad_gateway(answer, said):
    crossbar = start(ROUTES)
    net = crossbar.net
    net.on_request["titan"] = lambda host: host.transport.write(answer)
    client = crossbar.post(CHAT, chat())
    assert client.status == 502
    error = error_of(client)["error"]
    assert error["code"] == "bad_gateway" and "titan" in error["message"]
    assert said.lower() in error["message"].lower()
    assert crossbar.parts.hosts.healthy("titan")  # no health event
    assert "atlas" not in net.connections  # not retried
    assert len(net.connections["titan"]) == 1


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/r/convo/props"),
        ("GET", "/r/convo/slots"),
        ("GET", "/r/convo/metrics"),
        ("POST", "/r/convo/tokenize"),
        ("OPTIONS", "/r/convo/v1/chat/completions"),
        ("GET", "/r/convo/v1/chat/completions"),
    ],
)
def test_a_call_without_a_conversation_never_creates_a_lease(method, path):
    crossbar = start(ROUTES)
    net = crossbar.net
    net.on_request["titan"] = net.on_request["atlas"] = lambda host: host.answer(b"{}")
    body = b'{"content": "x"}' if method == "POST" else b""
    client = crossbar.send(method, path, body)
    assert client.status == 200 and client.header(b"X-Crossbar-Host") == b"titan"
    assert crossbar.store.rows == {} and crossbar.store.events == []
    assert crossbar.parts.limiter.in_flight("titan", MODEL) == 0
    assert len(crossbar.parts.table) == 0


def test_a_call_without_a_conversation_goes_to_the_route_lease_when_there_is_one():
    crossbar = start(ROUTES)
    net = crossbar.net
    net.on_request["titan"] = net.on_request["atlas"] = lambda host: host.answer(b"{}")
    # The route's own lease (left, say, from when the route had affinity = "route") is on
    # titan, and a conversation makes titan the busier host: the chooser would pick atlas.
    home = Key("convo", "", MODEL)
    ensureDeferred(crossbar.parts.table.acquire(home, ["titan", "atlas"], 1.0))
    crossbar.post(CHAT, chat("a conversation"))
    assert {k.fp: lease.host for k, lease in crossbar.store.rows.items()}[""] == "titan"
    leases = dict(crossbar.store.rows)
    # Calls with no conversation go where the route lease is, and record nothing.
    props = crossbar.send("GET", "/r/convo/props")
    assert props.header(b"X-Crossbar-Host") == b"titan"
    embed = crossbar.post("/r/convo/v1/embeddings", b'{"input": "x"}')
    assert embed.header(b"X-Crossbar-Host") == b"titan"
    assert crossbar.store.rows == leases


def test_an_inference_call_without_a_conversation_makes_no_lease():
    crossbar = start(ROUTES)
    net = crossbar.net
    net.on_request["titan"] = net.on_request["atlas"] = lambda host: host.answer(b"{}")
    # An embeddings call names no conversation: it goes where a new lease would, makes none.
    embed = crossbar.post("/r/convo/v1/embeddings", b'{"input": "x"}')
    assert embed.status == 200 and embed.header(b"X-Crossbar-Lease") == b"new"
    assert crossbar.store.rows == {} and crossbar.store.events == []


def test_a_pinned_route_sends_calls_without_a_conversation_to_its_pin():
    crossbar = start(ROUTES)
    net = crossbar.net
    net.on_request["atlas"] = lambda host: host.answer(b"{}")
    crossbar.parts.table.note_candidates("convo", ["titan", "atlas"])
    ensureDeferred(crossbar.parts.table.pin("convo", "atlas", 1.0))
    props = crossbar.send("GET", "/r/convo/props")
    assert props.header(b"X-Crossbar-Host") == b"atlas"
    assert props.header(b"X-Crossbar-Lease") == b"pinned"


def test_a_client_leaving_mid_stream_is_charged_the_tokens_it_was_sent():
    crossbar = start(ROUTES)
    net = crossbar.net
    net.on_request["titan"] = lambda host: sse(host, 20)
    client = crossbar.post(CHAT, chat())
    assert client.received.count(b"data: ") == 20
    client.transport.loseConnection()
    net.flush()
    (row,) = crossbar.store.usage
    assert (row.completion_tokens, row.error, row.stream) == (20, "client disconnected", True)


def test_a_stream_cut_by_a_stop_is_charged_its_tokens_and_says_shutdown():
    crossbar = start(ROUTES)
    net = crossbar.net
    net.on_request["titan"] = lambda host: sse(host, 7)
    crossbar.post(CHAT, chat())
    drained = []
    ensureDeferred(crossbar.sites.resource.drain(1)).addCallback(drained.append)
    net.clock.advance(1)
    net.flush()
    assert drained == [1]
    (row,) = crossbar.store.usage
    assert (row.completion_tokens, row.error) == (7, "shutdown")


def test_a_connect_timeout_that_fires_late_blames_the_reactor_not_the_host():
    # The process was frozen (or starved) past the connect timeout: the timer fires long after
    # it was due. That says nothing of the host: it stays, and so does the conversation.
    crossbar = start(ROUTES)
    net = crossbar.net
    net.on_request["titan"] = net.on_request["atlas"] = lambda host: host.answer()
    first = crossbar.post(CHAT, chat("kept"))
    assert first.header(b"X-Crossbar-Host") == b"titan"
    for host in net.connections["titan"]:
        host.transport.loseConnection()  # no pooled connection left: the next one connects
    net.flush()
    net.hanging.add("titan")
    client = crossbar.post(CHAT, chat("kept"))
    net.hanging.discard("titan")  # it would have connected: the reactor was not there
    net.clock.advance(20)  # frozen for 20 s: the 5 s timeout fires 15 s late
    net.flush()
    assert client.status == 200 and client.header(b"X-Crossbar-Host") == b"titan"
    assert crossbar.parts.hosts.healthy("titan")
    assert [e.reason for e in crossbar.store.events] == ["new"]  # nothing moved


def test_a_connect_timeout_on_time_still_takes_the_host_out():
    crossbar = start(ROUTES)
    net = crossbar.net
    net.on_request["atlas"] = lambda host: host.answer()
    net.hanging.add("titan")
    client = crossbar.post(CHAT, chat())
    net.clock.advance(5)
    net.flush()
    assert client.status == 200 and client.header(b"X-Crossbar-Host") == b"atlas"
    assert not crossbar.parts.hosts.healthy("titan")


def test_running_out_of_descriptors_is_crossbars_fault_not_the_hosts():
    crossbar = start(ROUTES)
    net = crossbar.net
    net.on_request["atlas"] = lambda host: host.answer()
    net.out_of_fds.add("titan")
    client = crossbar.post(CHAT, chat())
    assert client.status == 503 and b"Too many open files" in client.received
    assert crossbar.parts.hosts.healthy("titan")  # no host ejected, no conversation moved
    assert "atlas" not in net.connections


def half_answer(body: bytes) -> Any:
    """A host that sends the head and half of a whole answer, then closes."""

    def answer(host: Any) -> None:
        host.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[: len(body) // 2]
        )
        host.transport.loseConnection()

    return answer


def test_a_whole_answer_cut_half_way_has_shown_nothing_and_runs_again_elsewhere():
    crossbar = start(ROUTES)
    net = crossbar.net
    whole = b'{"id": "x", "choices": [{"message": {"content": "' + b"word " * 40 + b'"}}]}'
    net.on_request["titan"] = half_answer(whole)
    net.on_request["atlas"] = lambda host: host.answer(whole)
    client = crossbar.post(CHAT, chat())
    # Held until whole: the client saw none of titan's half, and gets atlas's answer.
    assert client.status == 200 and client.header(b"X-Crossbar-Resumed") == b"1"
    assert client.received.split(b"\r\n\r\n", 1)[1] == whole


def test_a_whole_answer_past_the_hold_bound_goes_out_as_it_comes(monkeypatch):
    monkeypatch.setattr(relay, "HOLD_MOST", 64)  # a chat answer is held up to 1 MiB
    crossbar = start(ROUTES)
    net = crossbar.net
    whole = b'{"id": "x", "choices": [{"message": {"content": "' + b"word " * 40 + b'"}}]}'
    net.on_request["titan"] = half_answer(whole)
    net.on_request["atlas"] = lambda host: host.answer(whole)
    client = crossbar.post(CHAT, chat())
    # Its first half had gone out: nothing may run again; the client sees the cut.
    assert client.status == 200 and client.header(b"X-Crossbar-Resumed") is None
    assert client.received.split(b"\r\n\r\n", 1)[1] == whole[: len(whole) // 2]
    assert "atlas" not in net.connections
