"""The proxy's HTTP/1.1 connection: pipelined requests answered in order, persistence by the
client's version and Connection header, 100 Continue only for a body to come, reading paused
while a client pipelines more than it reads, and an idle connection closed (in memory, on a
Clock)."""

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.logger import globalLogPublisher

from crossbar.proxy.channel import TURN_REQUESTS
from crossbar.wire.dialects import ErrorShape
from tests.support.memnet import MODEL, chat, start

ROUTES = {"convo": {"hosts": ["titan"], "default_model": MODEL}}
MODELS = b"GET /r/convo/v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
CHAT = b"POST /r/convo/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"


def post(body: bytes, head: bytes = CHAT) -> bytes:
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def test_pipelined_requests_are_answered_in_order_on_one_connection():
    crossbar = start(ROUTES, hosts=("titan",))
    net = crossbar.net
    client = crossbar.raw(post(chat("first")) + MODELS)
    (host,) = net.connections["titan"]
    assert host.requests() == 1 and client.received == b""  # the models list waits its turn
    host.answer(b'{"id": "first"}')
    net.flush()
    first, second = client.received.split(b"HTTP/1.1 200 OK")[1:]
    assert b'{"id": "first"}' in first and b'"object": "list"' in second
    assert not client.lost


def test_requests_answered_at_once_pipelined_many_deep_all_come_back():
    crossbar = start(ROUTES, hosts=("titan",))
    client = crossbar.raw(MODELS * 200)  # each answered within the last one's end
    assert client.received.count(b"HTTP/1.1 200 OK") == 200 and not client.lost


def test_an_http_1_0_request_is_answered_unchunked_and_its_connection_closes():
    crossbar = start(ROUTES, hosts=("titan",))
    client = crossbar.raw(b"GET /r/convo/v1/models HTTP/1.0\r\n\r\n")
    head, body = client.received.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.0 200 OK") and b"chunked" not in head.lower()
    assert body.startswith(b"{") and client.lost


def test_connection_close_is_answered_so_and_the_connection_closes():
    crossbar = start(ROUTES, hosts=("titan",))
    client = crossbar.raw(MODELS.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
    assert client.status == 200
    assert client.header(b"Connection") == b"close" and client.lost


def test_100_continue_is_sent_for_a_body_to_come_and_never_for_none():
    crossbar = start(ROUTES, hosts=("titan",))
    crossbar.net.on_request["titan"] = lambda host: host.answer()
    body = chat()
    client = crossbar.raw(CHAT + b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
    assert client.received == b"HTTP/1.1 100 Continue\r\n\r\n"
    client.transport.write(body)
    crossbar.net.flush()
    assert b"HTTP/1.1 200 OK" in client.received
    none = crossbar.raw(MODELS.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n"))
    assert none.received.startswith(b"HTTP/1.1 200 OK")


def test_empty_lines_before_a_request_line_are_skipped():
    crossbar = start(ROUTES, hosts=("titan",))
    client = crossbar.raw(b"\r\n\r\n" + MODELS)
    assert client.status == 200


def test_reading_pauses_while_a_client_pipelines_more_than_16_kib_behind_a_request():
    crossbar = start(ROUTES, hosts=("titan",))
    channel = crossbar.sites.proxy.buildProtocol(None)
    transport = StringTransport()
    channel.makeConnection(transport)
    channel.dataReceived(post(chat()))  # handled: waits for its host
    crossbar.net.flush()
    assert transport.producerState == "producing"
    channel.dataReceived(MODELS * 100)  # 4 KiB read ahead: still read, to see a client leave
    assert transport.producerState == "producing"
    channel.dataReceived(MODELS * 400)
    assert transport.producerState == "paused"
    (host,) = crossbar.net.connections["titan"]
    host.answer()
    crossbar.net.flush()
    assert transport.producerState == "producing"  # answered: the rest is read
    assert transport.value().count(b"HTTP/1.1 200 OK") == 501


def test_an_idle_connection_closes_after_the_sites_timeout_and_a_busy_one_does_not():
    crossbar = start(ROUTES, hosts=("titan",))
    net, timeout = crossbar.net, crossbar.sites.proxy.timeOut
    idle = crossbar.raw(MODELS)
    busy = crossbar.raw(post(chat()))  # its host never answers
    net.clock.advance(timeout - 1)
    idle.transport.write(MODELS)  # a request moves the idle mark on
    net.flush()
    net.clock.advance(timeout - 1)
    net.flush()
    assert not idle.lost
    net.clock.advance(2)
    net.flush()
    assert idle.lost and not busy.lost


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        (b"/r/convo/v1/messages", ErrorShape.ANTHROPIC),
        (b"/r/convo/v1/chat/completions", ErrorShape.OPENAI),
    ],
)
def test_a_body_refused_at_its_length_is_answered_in_its_paths_dialect(path, shape):
    crossbar = start(ROUTES, hosts=("titan",), max_body="10B")
    client = crossbar.raw(b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 99\r\n\r\n")
    assert client.received.startswith(b"HTTP/1.1 413 Payload Too Large") and client.lost
    if shape is ErrorShape.ANTHROPIC:
        assert b'"type": "request_too_large"' in client.received
    else:
        assert b'"code": 413' in client.received


NOPE = b"GET /r/nope/x HTTP/1.1\r\nHost: x\r\n\r\n"  # 404, answered by crossbar itself


def connected(crossbar, peer: str = "10.0.0.7"):
    channel = crossbar.sites.proxy.buildProtocol(None)
    transport = StringTransport(peerAddress=IPv4Address("TCP", peer, 40000))
    channel.makeConnection(transport)
    return channel, transport


def one_turn(clock) -> None:
    """Run what is due now and was due before this turn, as one pass of the reactor does
    (Clock.advance would also run what those calls schedule for now)."""
    due = [call for call in clock.getDelayedCalls() if call.getTime() <= clock.seconds()]
    for call in due:
        clock.calls.remove(call)
        call.called = 1
        call.func(*call.args, **call.kw)


def test_a_pipeline_answered_by_crossbar_itself_takes_turns_with_other_connections():
    """A connection pipelining requests crossbar answers at once gets TURN_REQUESTS of them
    answered per turn of the reactor; another connection's request is answered in between,
    and the pipeline is read no further while its backlog waits."""
    crossbar = start(ROUTES, hosts=("titan",))
    flood, flooded = connected(crossbar)
    other, answered = connected(crossbar)
    flood.dataReceived(NOPE * 1000)
    assert flooded.value().count(b"HTTP/1.1 404 ") == TURN_REQUESTS
    assert flooded.producerState == "paused"
    other.dataReceived(MODELS)
    assert answered.value().startswith(b"HTTP/1.1 200 OK")
    turns = 1
    while flooded.value().count(b"HTTP/1.1 404 ") < 1000:
        one_turn(crossbar.net.clock)
        turns += 1
        assert flooded.value().count(b"HTTP/1.1 404 ") <= turns * TURN_REQUESTS
    assert turns == -(-1000 // TURN_REQUESTS)
    assert flooded.producerState == "producing" and not flooded.disconnecting


def test_a_pipeline_behind_a_forwarded_request_also_takes_turns():
    crossbar = start(ROUTES, hosts=("titan",))
    flood, flooded = connected(crossbar)
    flood.dataReceived(post(chat()) + NOPE * 100)  # the first waits for its host
    crossbar.net.flush()
    (host,) = crossbar.net.connections["titan"]
    host.answer()
    crossbar.net.pumps[0].flush(advanceClock=False)  # the answer, and no turn after it
    assert flooded.value().count(b"HTTP/1.1 404 ") == TURN_REQUESTS
    crossbar.net.flush()
    assert flooded.value().count(b"HTTP/1.1 404 ") == 100


def test_refusals_before_routing_log_a_few_lines_per_client_then_one_line_for_the_rest():
    crossbar = start(ROUTES, hosts=("titan",))
    usage = crossbar.parts.usage
    lines, said = [], []
    usage.log_line = lines.append

    def hear(event):
        if event.get("log_namespace") == "crossbar.request":
            said.append(event)

    globalLogPublisher.addObserver(hear)
    try:
        flood, flooded = connected(crossbar)
        flood.dataReceived(NOPE * 500)
        crossbar.net.clock.advance(0)
        assert flooded.value().count(b"HTTP/1.1 404 ") == 500
        assert len(lines) == usage.refusals.burst
        other, _ = connected(crossbar, peer="10.0.0.8")
        other.dataReceived(NOPE)  # another client's refusal still has its line
        assert len(lines) == usage.refusals.burst + 1
        assert said == []
        crossbar.net.clock.advance(usage.refusals.interval)  # the rest, in one line
    finally:
        globalLogPublisher.removeObserver(hear)
    (summary,) = said
    assert summary["refused"] == 490 and summary["peer"] == "10.0.0.7"
    assert "490 more requests like these from 10.0.0.7" in summary["line"]


@pytest.mark.parametrize(
    ("head", "why"),
    [
        (b"GET /r/convo/v1/models HTTP/1.1\r\n\r\n", b"must have a Host header"),
        (b"GET /r/convo/v1/models HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", b"2 Host headers"),
        (b"GET /r/convo/v1/models HTTP/1.0\r\nHost: a\r\nhost: a\r\n\r\n", b"2 Host headers"),
    ],
)
def test_an_http_1_1_request_without_one_host_header_is_refused_400(head, why):
    """RFC 9112, 3.2: exactly one Host on HTTP/1.1; HTTP/1.0 may leave it out, never send two."""
    crossbar = start(ROUTES, hosts=("titan",))
    client = crossbar.raw(head)
    assert client.status == 400 and why in client.received and client.lost


def test_an_http_1_0_request_may_leave_its_host_out():
    crossbar = start(ROUTES, hosts=("titan",))
    client = crossbar.raw(b"GET /r/convo/v1/models HTTP/1.0\r\n\r\n")
    assert client.received.startswith(b"HTTP/1.0 200 OK")


@pytest.mark.parametrize(
    "target",
    [b"http://crossbar/r/convo/v1/models", b"HTTP://crossbar:8080/r/convo/v1/models?x=1"],
)
def test_a_target_in_absolute_form_is_served_by_its_path(target):
    """RFC 9112, 3.2.2: a server takes a target in absolute form, its path and query."""
    crossbar = start(ROUTES, hosts=("titan",))
    client = crossbar.raw(b"GET " + target + b" HTTP/1.1\r\nHost: elsewhere\r\n\r\n")
    assert client.status == 200 and b'"object": "list"' in client.received


def test_an_absolute_target_names_the_host_the_admin_api_reads():
    crossbar = start(ROUTES, hosts=("titan",))
    client = crossbar.net.client(crossbar.sites.admin, peer="127.0.0.1")
    client.transport.write(
        b"GET http://localhost/api/hosts HTTP/1.1\r\nHost: \xff\xfe-not-utf8\r\n\r\n"
    )
    crossbar.net.flush()
    assert client.status == 200  # the Host header, not UTF-8, was never read
