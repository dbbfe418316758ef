"""The admin port has the proxy's connection rules: a head that trickles gets 408, what Twisted
cannot parse gets 400, 414 or 431, all with crossbar's JSON error body, never HTML and never a
logged traceback (in memory, on a Clock)."""

import json

import pytest
from twisted.logger import globalLogPublisher

from tests.support.memnet import MODEL, start

ROUTES = {"convo": {"hosts": ["titan"], "default_model": MODEL}}


class Failures:
    """Logged failures (tracebacks), and events that say a Failure happened, while a test runs."""

    def __init__(self):
        self.seen = []

    def __call__(self, event):
        if event.get("log_failure") is not None or event.get("isError"):
            self.seen.append(event)

    def __enter__(self):
        globalLogPublisher.addObserver(self)
        return self

    def __exit__(self, *exc):
        globalLogPublisher.removeObserver(self)


def admin_client(crossbar):
    return crossbar.net.client(crossbar.sites.admin, peer="127.0.0.1")


def error_of(client) -> tuple[int | None, dict]:
    assert client.header(b"Content-Type") == b"application/json", client.received[:300]
    return client.status, json.loads(client.received.split(b"\r\n\r\n", 1)[1])


def test_an_admin_head_that_trickles_gets_408_after_header_timeout():
    crossbar = start(ROUTES, hosts=("titan",), header_timeout="10s")
    net = crossbar.net
    client = admin_client(crossbar)
    client.transport.write(b"GET /api/hosts HTTP/1.1\r\n")
    net.flush()
    for _ in range(9):
        net.clock.advance(1)
        client.transport.write(b"X")
        net.flush()
    assert client.status is None and not client.lost
    net.clock.advance(1)
    net.flush()
    status, error = error_of(client)
    assert status == 408 and "headers" in error["error"]["message"] and client.lost


def test_an_admin_body_that_trickles_gets_408_at_body_deadline():
    crossbar = start(ROUTES, hosts=("titan",), body_deadline="5s")
    net = crossbar.net
    client = admin_client(crossbar)
    client.transport.write(
        b"PUT /api/routes/convo/pin HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{"
    )
    net.flush()
    net.clock.pump([1] * 4)
    net.flush()
    assert client.status is None
    net.clock.advance(1)
    net.flush()
    status, error = error_of(client)
    assert status == 408 and "body" in error["error"]["message"] and client.lost


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414),
        (b"GET /api/hosts HTTP/1.1\r\nX-Big: " + b"b" * 20_000 + b"\r\n\r\n", 431),
        (b"GET /api/hosts HTTP/1.1\r\n" + b"X-A: b\r\n" * 600 + b"\r\n", 431),
        (b"NOT HTTP AT ALL\r\n\r\n", 400),
        (b"GET /api/hosts HTTP/1.1\r\nBad Header\r\n\r\n", 400),
        (b"GET /api/hosts HTTP/1.1\r\nHost: x\r\n  folded\r\n\r\n", 400),
    ],
    ids=["long-line", "long-header", "many-headers", "bad-line", "bad-header", "folded"],
)
def test_admin_requests_twisted_cannot_parse_get_a_json_answer(data, status):
    crossbar = start(ROUTES, hosts=("titan",))
    client = admin_client(crossbar)
    with Failures() as failures:
        client.transport.write(data)
        crossbar.net.flush()
    got, error = error_of(client)
    assert got == status and client.lost
    assert error["error"]["type"] == "invalid_request_error" and error["error"]["message"]
    assert failures.seen == []


@pytest.mark.parametrize(
    "request_line",
    [b"GET /api/%ff HTTP/1.1", b"GET /api/hosts/%c3%28 HTTP/1.1", b"GET /%80 HTTP/1.1"],
)
def test_an_admin_path_that_is_not_utf8_gets_a_json_400_and_no_traceback(request_line):
    crossbar = start(ROUTES, hosts=("titan",))
    client = admin_client(crossbar)
    with Failures() as failures:
        client.transport.write(request_line + b"\r\nHost: localhost\r\n\r\n")
        crossbar.net.flush()
    status, error = error_of(client)
    assert status == 400 and "UTF-8" in error["error"]["message"]
    assert failures.seen == []
    assert not client.lost  # a well-framed request: the connection stays for the next one


def test_an_admin_host_header_that_is_not_utf8_gets_a_json_400_and_no_traceback():
    crossbar = start(ROUTES, hosts=("titan",))
    client = admin_client(crossbar)
    with Failures() as failures:
        client.transport.write(b"GET /api/hosts HTTP/1.1\r\nHost: \xff\xfe\r\n\r\n")
        crossbar.net.flush()
    status, _ = error_of(client)
    assert status == 400 and failures.seen == []


def test_the_admin_api_still_answers_and_keeps_the_connection():
    crossbar = start(ROUTES, hosts=("titan",))
    client = admin_client(crossbar)
    client.transport.write(b"GET /api/hosts HTTP/1.1\r\nHost: localhost\r\n\r\n" * 2)
    crossbar.net.flush()
    assert client.received.count(b"HTTP/1.1 200 OK") == 2 and not client.lost
