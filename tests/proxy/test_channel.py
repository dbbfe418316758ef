"""The proxy's HTTP/1.1 connection: pipelined requests answered in order, persistence by the
client's version and Connection header, 100 Continue only for a body to come, reading paused
while a client pipelines more than it reads, and an idle connection closed (in memory, on a
Clock)."""

import pytest
from twisted.internet.testing import StringTransport

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
    client = crossbar.raw(b"GET /r/convo/v1/models HTTP/1.1\r\nConnection: close\r\n\r\n")
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
