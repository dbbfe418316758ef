"""How a request's credentials are read: a secret that is not ASCII authenticates with the
UTF-8 bytes a client sends for it, bytes that are not UTF-8 match no key, and a request with
two Authorization (or two x-api-key) headers is refused 400 in its own dialect, not read by
whichever came last (in memory)."""

from __future__ import annotations

import json

from tests.support.memnet import CHAT_PATH, MODEL, chat, start

SECRET = "clé-秘密-ünïcode-0123456789"
ROUTES = {"convo": {"hosts": ["titan"], "default_model": MODEL, "auth": "keys"}}


def crossbar_with_key():
    crossbar = start(
        ROUTES, hosts=("titan",), keys={"dev": {"secret": SECRET, "routes": ["convo"]}}
    )
    crossbar.net.on_request["titan"] = lambda host: host.answer()
    return crossbar


def sent(crossbar, *headers: bytes, path: str = CHAT_PATH):
    body = chat()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n".encode()
    client = crossbar.raw(head + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body)
    assert client.status is not None, client.received
    return client


def error_of(client) -> dict:
    return json.loads(client.received.split(b"\r\n\r\n", 1)[1])


def test_a_secret_that_is_not_ascii_authenticates_as_its_utf8_bytes():
    crossbar = crossbar_with_key()
    utf8 = SECRET.encode("utf-8")
    answered = sent(crossbar, b"Authorization: Bearer " + utf8)
    assert answered.status == 200 and answered.header(b"X-Crossbar-Key") == b"dev"
    anthropic = sent(crossbar, b"x-api-key: " + utf8, path="/r/convo/v1/messages")
    assert anthropic.header(b"X-Crossbar-Key") == b"dev"


def test_a_secret_sent_in_another_encoding_matches_nothing():
    crossbar = crossbar_with_key()
    latin1 = "clé-ünïcode".encode("latin-1")  # not UTF-8
    assert sent(crossbar, b"Authorization: Bearer " + latin1).status == 401


def test_two_authorization_headers_are_refused_whichever_would_match():
    crossbar = crossbar_with_key()
    utf8 = SECRET.encode("utf-8")
    client = sent(crossbar, b"Authorization: Bearer wrong", b"Authorization: Bearer " + utf8)
    error = error_of(client)
    assert client.status == 400 and error["error"]["type"] == "invalid_request_error"
    assert "2 Authorization headers" in error["error"]["message"]
    assert crossbar.net.connections == {}  # nothing reached a host


def test_two_api_key_headers_are_refused_in_anthropics_dialect():
    crossbar = crossbar_with_key()
    utf8 = SECRET.encode("utf-8")
    client = sent(
        crossbar, b"x-api-key: " + utf8, b"X-Api-Key: " + utf8, path="/r/convo/v1/messages"
    )
    error = error_of(client)
    assert client.status == 400 and error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
