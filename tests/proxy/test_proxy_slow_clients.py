"""Clients too slow to send or to read do not hold connections and slots forever; requests
Twisted cannot parse get a JSON answer, not a dropped connection (in memory, on a Clock)."""

import json

import pytest

from tests.support.memnet import MODEL, chat, start

ROUTES = {"convo": {"hosts": ["titan"], "default_model": MODEL}}
CHAT = "/r/convo/v1/chat/completions"


def error_of(client) -> tuple[int, dict]:
    return client.status, json.loads(client.received.split(b"\r\n\r\n", 1)[1])


def test_headers_that_trickle_in_get_408_after_header_timeout():
    crossbar = start(ROUTES, hosts=("titan",), header_timeout="10s")
    net = crossbar.net
    client = crossbar.raw(b"POST " + CHAT.encode() + b" HTTP/1.1\r\n")
    for _ in range(9):  # a header byte a second keeps an idle timer alive forever...
        net.clock.advance(1)
        client.transport.write(b"X")
        net.flush()
    assert client.status is None and not client.lost
    net.clock.advance(1)  # ...but not the deadline for the whole head
    net.flush()
    status, error = error_of(client)
    assert status == 408 and "headers" in error["error"]["message"] and client.lost
    assert crossbar.store.usage == []  # nothing reached a host


def test_a_body_that_stops_arriving_gets_408_after_body_timeout():
    crossbar = start(ROUTES, hosts=("titan",), body_timeout="30s")
    net = crossbar.net
    client = crossbar.raw(
        b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
    )
    net.clock.advance(29)
    client.transport.write(b'"model"')  # progress resets the timer
    net.flush()
    net.clock.advance(29)
    net.flush()
    assert client.status is None
    net.clock.advance(1)
    net.flush()
    status, error = error_of(client)
    assert status == 408 and "body" in error["error"]["message"] and client.lost
    assert "titan" not in net.connections


def test_a_body_that_never_starts_gets_408_after_body_timeout_from_the_end_of_its_head():
    crossbar = start(ROUTES, hosts=("titan",), body_timeout="30s")
    net = crossbar.net
    client = crossbar.raw(
        b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n"
    )
    net.clock.advance(29)
    net.flush()
    assert client.status is None and not client.lost
    net.clock.advance(1)
    net.flush()
    status, error = error_of(client)
    assert status == 408 and "body" in error["error"]["message"] and client.lost


def test_a_body_that_trickles_gets_408_at_body_deadline_after_its_head():
    crossbar = start(ROUTES, hosts=("titan",), body_timeout="30s")  # body_deadline "60s"
    net = crossbar.net
    client = crossbar.raw(
        b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
    )
    net.clock.advance(20)  # a wait for the first byte counts in the deadline too
    client.transport.write(b"{")
    net.flush()
    for _ in range(39):  # a byte a second never trips body_timeout...
        net.clock.advance(1)
        client.transport.write(b" ")
        net.flush()
    assert client.status is None and not client.lost
    net.clock.advance(1)  # ...but the whole body is due body_deadline after its head
    net.flush()
    status, error = error_of(client)
    assert status == 408 and "body" in error["error"]["message"] and client.lost
    assert "titan" not in net.connections


def test_the_body_deadline_is_the_configured_one_and_answers_in_the_callers_dialect():
    crossbar = start(ROUTES, hosts=("titan",), body_deadline="5s")
    net = crossbar.net
    client = crossbar.raw(
        b"POST /r/convo/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
    )
    net.clock.pump([1] * 4)
    client.transport.write(b" ")
    net.flush()
    assert client.status is None
    net.clock.advance(1)
    net.flush()
    status, error = error_of(client)
    assert status == 408 and error["type"] == "error" and client.lost


def test_a_body_that_arrives_within_the_deadline_is_not_held_to_it_on_the_next_request():
    crossbar = start(ROUTES, hosts=("titan",), body_deadline="5s")
    net = crossbar.net
    net.on_request["titan"] = lambda host: host.answer()
    body = chat()
    client = crossbar.raw(
        b"POST "
        + CHAT.encode()
        + b" HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
        + body[:5]
    )
    net.clock.advance(4)
    client.transport.write(body[5:])
    net.flush()
    assert client.status == 200
    net.clock.advance(10)
    net.flush()
    assert not client.lost and client.received.count(b"HTTP/1.1 ") == 1


def test_a_keepalive_connection_between_requests_is_not_held_to_the_header_deadline():
    crossbar = start(ROUTES, hosts=("titan",), header_timeout="10s")
    net = crossbar.net
    net.on_request["titan"] = lambda host: host.answer()
    client = crossbar.post(CHAT, chat())
    assert client.status == 200
    net.clock.advance(30)  # idle between requests: the site's own idle timer governs
    net.flush()
    assert not client.lost


def test_a_client_that_stops_reading_a_stream_is_dropped_and_its_slot_freed():
    crossbar = start(ROUTES, hosts=("titan",), client_write_timeout="60s")
    net, limiter = crossbar.net, crossbar.parts.limiter

    def stream(host):
        host.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        event = b'data: {"id": "c1"}\n\n'
        host.transport.write(b"%x\r\n%s\r\n" % (len(event), event))

    net.on_request["titan"] = stream
    client = crossbar.post(CHAT, chat())
    assert client.status == 200 and limiter.in_flight("titan", MODEL) == 1
    client.stop_reading()
    net.clock.advance(59)
    net.flush()
    assert not client.lost and limiter.in_flight("titan", MODEL) == 1
    client.read_again()  # reading again resets the clock
    client.stop_reading()
    net.clock.advance(59)
    net.flush()
    assert not client.lost
    net.clock.advance(1)
    net.flush()
    assert client.lost
    (upstream,) = net.connections["titan"]
    assert upstream.lost  # the host's answer is aborted too
    assert limiter.in_flight("titan", MODEL) == 0
    (row,) = crossbar.store.usage
    assert row.error == "client stopped reading" and row.completion_tokens == 1


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n", 414),
        (b"GET /r/convo/health HTTP/1.1\r\nX-Big: " + b"b" * 20000 + b"\r\n\r\n", 431),
        (b"GET /r/convo/health HTTP/1.1\r\n" + b"X-A: b\r\n" * 600 + b"\r\n", 431),
        (b"NOT HTTP AT ALL\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", 400),
    ],
    ids=["long-line", "long-header", "many-headers", "bad-line", "bad-length", "bad-header"],
)
def test_requests_twisted_cannot_parse_get_a_json_answer(data, status):
    crossbar = start(ROUTES, hosts=("titan",))
    client = crossbar.raw(data)
    got, error = error_of(client)
    assert got == status and client.lost
    assert error["error"]["type"] == "invalid_request_error" and error["error"]["message"]


def test_an_unparsable_request_on_anthropics_path_gets_anthropics_shape():
    crossbar = start(ROUTES, hosts=("titan",))
    client = crossbar.raw(b"POST /r/convo/v1/messages HTTP/1.1\r\nContent-Length: -1\r\n\r\n")
    got, error = error_of(client)
    assert got == 400 and error["type"] == "error"
