"""Every error crossbar makes is an error body in the client's dialect (OpenAI's, or Anthropic's on
/v1/messages) that tells the client what to do."""

import json
import socket

import pytest
import pytest_twisted
from twisted.internet.threads import deferToThread

from tests.support.harness import MODEL, start_crossbar, start_fakes, until, wait

ROUTES = {
    "convo": {"hosts": ["titan"], "default_model": MODEL},
    "locked": {"hosts": ["titan"], "keys": ["k-123"]},
}
CHAT = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest_twisted.async_yield_fixture
async def crossbar():
    running = await start_crossbar(await start_fakes("titan"), ROUTES, server={"max_body": "1MiB"})
    yield running
    await running.stop()


CASES = [
    ("POST", "/r/nope/v1/chat/completions", {}, CHAT, 404, "not_found_error", 404),
    ("POST", "/v1/chat/completions", {}, CHAT, 404, "not_found_error", 404),
    (
        "POST",
        "/r/locked/v1/chat/completions",
        {},
        CHAT,
        401,
        "authentication_error",
        "invalid_api_key",
    ),
    (
        "POST",
        "/r/locked/v1/chat/completions",
        {"Authorization": "Bearer wrong"},
        CHAT,
        401,
        "authentication_error",
        "invalid_api_key",
    ),
    ("POST", "/r/convo/v1/chat/completions", {}, b"{not json", 400, "invalid_request_error", 400),
    ("POST", "/r/convo/v1/chat/completions", {}, b"[1, 2]", 400, "invalid_request_error", 400),
    ("POST", "/r/convo/v1/chat/completions", {}, b"", 400, "invalid_request_error", 400),
    (
        "POST",
        "/r/convo/v1/chat/completions",
        {},
        json.dumps({"model": "llama-99", "messages": []}).encode(),
        404,
        "not_found_error",
        "model_not_found",
    ),
    ("GET", "/r/convo/v1/nothing-here", {}, b"", 404, "not_found_error", 404),
    (
        "POST",
        "/r/convo/v1/chat/completions",
        {},
        b"x" * (2 * 1024 * 1024),
        413,
        "invalid_request_error",
        413,
    ),
]


@pytest.mark.parametrize(
    ("method", "path", "headers", "data", "status", "type_", "code"),
    CASES,
    ids=[f"{c[4]}-{c[1]}-{len(c[3])}" for c in CASES],
)
@pytest_twisted.ensureDeferred
async def test_bad_input_gets_an_openai_error_body(
    crossbar, method, path, headers, data, status, type_, code
):
    response = await wait(
        crossbar.client().request(method, crossbar.base + path, data=data or None, headers=headers)
    )
    body = json.loads(await response.content())
    assert response.code == status
    assert set(body) == {"error"}
    assert body["error"]["type"] == type_
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    assert crossbar.fakes["titan"].counters.requests["/v1/chat/completions"] == 0


MESSAGES = json.dumps(
    {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
).encode()
ANTHROPIC_CASES = [
    ("/r/nope/v1/messages", {}, MESSAGES, 404, "not_found_error"),
    ("/r/locked/v1/messages", {"X-Api-Key": "wrong"}, MESSAGES, 401, "authentication_error"),
    ("/r/convo/v1/messages", {}, b"{not json", 400, "invalid_request_error"),
    (
        "/r/convo/v1/messages",
        {},
        json.dumps({"model": "claude-9", "messages": []}).encode(),
        404,
        "not_found_error",
    ),
    ("/r/convo/v1/messages", {}, b"x" * (2 * 1024 * 1024), 413, "request_too_large"),
    ("/r/convo/v1/messages/batches", {}, MESSAGES, 404, "not_found_error"),
]


@pytest.mark.parametrize(
    ("path", "headers", "data", "status", "type_"),
    ANTHROPIC_CASES,
    ids=[f"{c[3]}-{c[0]}" for c in ANTHROPIC_CASES],
)
@pytest_twisted.ensureDeferred
async def test_errors_on_anthropic_messages_come_in_anthropics_shape(
    crossbar, path, headers, data, status, type_
):
    response = await wait(crossbar.client().post(crossbar.base + path, data=data, headers=headers))
    body = json.loads(await response.content())
    assert response.code == status
    assert body["type"] == "error" and set(body) == {"type", "error"}
    assert body["error"]["type"] == type_ and body["error"]["message"]
    assert set(body["error"]) == {"type", "message"}


@pytest_twisted.ensureDeferred
async def test_a_full_queue_says_so_with_its_status_phrase_and_retry_after(launch):
    fakes = await start_fakes("titan", tokens_per_second=20)
    crossbar = await launch(
        fakes, {"convo": {"hosts": ["titan"]}}, server={"queue_max": 0}, parallel=1
    )
    body = json.dumps(
        {"model": MODEL, "max_tokens": 20, "messages": [{"role": "user", "content": "x"}]}
    ).encode()
    slow = crossbar.client().post(crossbar.url("convo", "/v1/chat/completions"), data=body)
    await until(lambda: crossbar.parts.limiter.in_flight("titan", MODEL) == 1)
    head = b"POST /r/convo/v1/messages HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    head += b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    reply = await wait(deferToThread(raw_exchange, crossbar.port.getHost().port, head, body))
    status, _, rest = reply.partition(b"\r\n")
    assert status == b"HTTP/1.1 429 Too Many Requests"
    assert b"\r\nRetry-After: " in rest
    error = json.loads(rest.split(b"\r\n\r\n", 1)[1])
    assert error["error"]["type"] == "rate_limit_error" and error["type"] == "error"
    await wait((await wait(slow)).content())


@pytest_twisted.ensureDeferred
async def test_an_anthropic_style_x_api_key_opens_a_locked_route_too(crossbar):
    for key, code in (("k-123", 200), ("wrong", 401)):
        response = await wait(
            crossbar.client().post(
                crossbar.url("locked", "/v1/chat/completions"),
                data=CHAT,
                headers={"X-Api-Key": key},
            )
        )
        await response.content()
        assert response.code == code


@pytest_twisted.ensureDeferred
async def test_a_good_key_opens_a_locked_route_and_is_never_forwarded(crossbar):
    response = await wait(
        crossbar.client().post(
            crossbar.url("locked", "/v1/chat/completions"),
            data=CHAT,
            headers={"Authorization": "Bearer k-123"},
        )
    )
    assert response.code == 200
    await response.content()


def raw_exchange(port: int, head: bytes, body: bytes = b"") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body)
        chunks = []
        while True:
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
        return b"".join(chunks)


@pytest_twisted.ensureDeferred
async def test_a_huge_content_length_is_refused_at_once_without_reading_the_body(crossbar):
    head = (
        b"POST /r/convo/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n"
    )
    reply = await wait(deferToThread(raw_exchange, crossbar.port.getHost().port, head, b"{"))
    status, _, rest = reply.partition(b"\r\n")
    assert status == b"HTTP/1.1 413 Payload Too Large"
    assert json.loads(rest.split(b"\r\n\r\n", 1)[1])["error"]["code"] == 413


@pytest_twisted.ensureDeferred
async def test_a_body_refused_at_its_headers_is_not_asked_for_with_100_continue(crossbar):
    # A real socket: Twisted sends what is written after loseConnection, memory transports not.
    head = (
        b"POST /r/convo/v1/messages HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n"
    )
    reply = await wait(deferToThread(raw_exchange, crossbar.port.getHost().port, head))
    assert reply.startswith(b"HTTP/1.1 413 ")
    assert b"100 Continue" not in reply
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["type"] == "request_too_large"


@pytest_twisted.ensureDeferred
async def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit(crossbar):
    head = (
        b"POST /r/convo/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"x" * 512 * 1024
    body = (hex(len(chunk))[2:].encode() + b"\r\n" + chunk + b"\r\n") * 3  # 1.5 MiB, no end
    reply = await wait(deferToThread(raw_exchange, crossbar.port.getHost().port, head, body))
    assert reply.startswith(b"HTTP/1.1 413 ")


@pytest_twisted.ensureDeferred
async def test_an_exception_inside_crossbar_reaches_the_client_as_a_plain_500(crossbar):
    async def broken(*args, **kwargs):
        raise RuntimeError("secret internals /home/crossbar/lease.py line 42")

    crossbar.parts.table.acquire = broken
    response = await wait(
        crossbar.client().post(crossbar.url("convo", "/v1/chat/completions"), data=CHAT)
    )
    text = (await response.content()).decode()
    assert response.code == 500
    assert json.loads(text)["error"]["type"] == "api_error"
    assert "Traceback" not in text and "secret internals" not in text and ".py" not in text
