"""A request whose framing two parsers could read two ways (the raw material of request
smuggling) gets 400 with crossbar's JSON body in the caller's dialect, and the connection
closes; nothing reaches a host. Told on raw bytes, in memory."""

import json

from tests.support.memnet import MODEL, chat, start

ROUTES = {"convo": {"hosts": ["titan"], "default_model": MODEL}}
CHAT = b"POST /r/convo/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
MESSAGES = b"POST /r/convo/v1/messages HTTP/1.1\r\nHost: x\r\n"
BODY = chat()


def chunked(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


def refused(data: bytes) -> dict:
    """Send `data` on a new connection; the answer must be a 400 that closes it, and no host may
    have heard of the request."""
    crossbar = start(ROUTES, hosts=("titan",))
    crossbar.net.on_request["titan"] = lambda host: host.answer()
    client = crossbar.raw(data)
    assert client.status == 400, client.received[:300]
    assert client.lost
    assert client.header(b"Content-Type") == b"application/json"
    assert crossbar.net.connections == {}  # nothing reached a host
    return json.loads(client.received.split(b"\r\n\r\n", 1)[1])


def openai(error: dict) -> str:
    assert error["error"]["type"] == "invalid_request_error" and error["error"]["code"] == 400
    return error["error"]["message"]


def anthropic(error: dict) -> str:
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    return error["error"]["message"]


def test_a_second_transfer_encoding_line_is_refused():
    head = CHAT + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n"
    assert "Transfer-Encoding" in openai(refused(head + chunked(BODY)))


def test_transfer_encoding_identity_beside_a_content_length_is_refused():
    head = CHAT + b"Transfer-Encoding: identity\r\nContent-Length: %d\r\n\r\n" % len(BODY)
    assert "Transfer-Encoding" in openai(refused(head + BODY))


def test_chunked_on_an_http_1_0_request_is_refused():
    head = b"POST /r/convo/v1/messages HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert "HTTP/1.0" in anthropic(refused(head + chunked(BODY)))


def test_a_folded_header_line_is_refused():
    head = MESSAGES + b"X-Note: one\r\n  two\r\nContent-Length: %d\r\n\r\n" % len(BODY)
    assert "folded" in anthropic(refused(head + BODY))


def test_a_folded_header_line_with_a_tab_is_refused():
    head = CHAT + b"\tX-Smuggled: 1\r\nContent-Length: %d\r\n\r\n" % len(BODY)  # onto Host
    assert "folded" in openai(refused(head + BODY))


def test_a_last_chunk_without_its_final_crlf_does_not_swallow_the_next_request():
    # Read leniently, the next request's head passes for the body's trailer fields and is lost;
    # another parser in front or behind reads two requests.
    body = b"%x\r\n%s\r\n0\r\n" % (len(BODY), BODY)
    smuggled = b"GET /r/convo/v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    head = CHAT + b"Transfer-Encoding: chunked\r\n\r\n"
    assert "trailer" in openai(refused(head + body + smuggled))


def test_a_chunk_size_that_overflows_is_refused_at_once():
    head = CHAT + b"Transfer-Encoding: chunked\r\n\r\n"
    assert "chunk size" in openai(refused(head + b"1" + b"0" * 19 + b"\r\n{"))


def test_a_chunk_size_that_is_not_hex_is_refused():
    head = CHAT + b"Transfer-Encoding: chunked\r\n\r\n"
    assert "chunk size" in openai(refused(head + b"0x10\r\n{"))


def test_bare_lf_line_ends_in_the_head_are_refused_at_once():
    data = b"POST /r/convo/v1/chat/completions HTTP/1.1\nHost: x\nContent-Length: 2\n\n{}"
    assert "LF" in openai(refused(data))


def test_a_bare_lf_inside_a_header_line_is_refused():
    data = CHAT + b"X-A: 1\nX-B: 2\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY
    openai(refused(data))


def test_bare_lf_line_ends_in_a_chunked_body_are_refused_at_once():
    head = CHAT + b"Transfer-Encoding: chunked\r\n\r\n"
    assert "LF" in openai(refused(head + b"%x\n%s\n0\n\n" % (len(BODY), BODY)))


def test_a_request_pipelined_behind_a_body_with_line_feeds_is_not_taken_for_bare_lf():
    crossbar = start(ROUTES, hosts=("titan",))
    body = b'{\n"messages": 5\n}'
    client = crossbar.raw(
        b"POST /r/nope/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
        % len(body)
        + body
        + b"GE"  # the next request's first bytes, behind a body answered at once (404)
    )
    client.transport.write(b"T /r/convo/v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    crossbar.net.flush()
    assert b"HTTP/1.1 404 " in client.received and b"HTTP/1.1 200 OK" in client.received
    assert b"bare LF" not in client.received and not client.lost


def test_a_chunked_body_with_extensions_and_trailer_fields_is_still_forwarded():
    crossbar = start(ROUTES, hosts=("titan",))
    crossbar.net.on_request["titan"] = lambda host: host.answer()
    half = len(BODY) // 2
    body = b"%x;name=value\r\n%s\r\n%X\r\n%s\r\n0\r\nX-Checksum: abc\r\n\r\n" % (
        half,
        BODY[:half],
        len(BODY) - half,
        BODY[half:],
    )
    head = CHAT + b"Transfer-Encoding: Chunked\r\n\r\n"
    client = crossbar.raw(head + body)
    assert client.status == 200 and not client.lost
    (host,) = crossbar.net.connections["titan"]
    assert host.received.endswith(BODY)
