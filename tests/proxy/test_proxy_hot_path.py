"""What the hot path keeps cheap without changing what the client sees: the host's
Content-Length goes through (no re-chunking), small writes are never held by Nagle, and a POST
body is never parsed as a form."""

import json
import socket

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Factory, Protocol
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from crossbar.proxy.channel import ProxyChannel
from crossbar.wire.endpoints import HostEndpoints
from tests.support.harness import MODEL, start_crossbar, wait

ANSWER = json.dumps({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 3}}).encode()


class Answers(Resource):
    """A host answering JSON with a Content-Length, and a stream without one."""

    isLeaf = True

    def __init__(self):
        super().__init__()
        self.bodies = []

    def render_POST(self, request):
        body = request.content.read()
        self.bodies.append(body)
        if b'"stream": true' in body:
            request.setHeader(b"content-type", b"text/event-stream")
            request.write(b'data: {"id": "chatcmpl-2", "choices": []}\n\n')
            request.write(b"data: [DONE]\n\n")
            request.finish()
            return NOT_DONE_YET
        request.setHeader(b"content-type", b"application/json")
        return ANSWER  # twisted.web sends a Content-Length for a body returned whole


class Raw(Protocol):
    """Collects a raw HTTP/1.1 answer until the connection closes."""

    def __init__(self):
        self.data = b""
        self.closed: Deferred[bytes] = Deferred()

    def dataReceived(self, data):
        self.data += data

    def connectionLost(self, reason):
        self.closed.callback(self.data)


async def raw_post(port: int, path: str, body: bytes, ctype: str = "application/json") -> bytes:
    protocol = await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), Raw())
    protocol.transport.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: {ctype}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return await wait(protocol.closed)


@pytest_twisted.async_yield_fixture
async def crossbar_before_answers():
    """Crossbar's route "convo" before one host answering with `Answers`: (answers, port)."""
    answers = Answers()
    upstream = reactor.listenTCP(
        0, Site(answers, parsePOSTFormSubmission=False), interface="127.0.0.1"
    )
    hosts = {
        "titan": {
            "url": f"http://127.0.0.1:{upstream.getHost().port}",
            "models": {MODEL: {"parallel": 2}},
        }
    }
    crossbar = await start_crossbar({}, {"convo": {"hosts": ["titan"]}}, hosts=hosts)
    try:
        yield answers, int(crossbar.url("convo", "/").split(":")[2].split("/")[0])
    finally:
        await crossbar.stop()
        await upstream.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_json_answer_keeps_the_hosts_length_and_a_stream_stays_chunked(
    crossbar_before_answers,
):
    _, port = crossbar_before_answers
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    head, _, body = (
        await raw_post(port, "/r/convo/v1/chat/completions", json.dumps(chat).encode())
    ).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert f"content-length: {len(ANSWER)}".encode() in head.lower()
    assert b"transfer-encoding" not in head.lower()
    assert body == ANSWER  # byte for byte, not re-chunked

    streamed = json.dumps({**chat, "stream": True}).encode()
    head, _, body = (await raw_post(port, "/r/convo/v1/chat/completions", streamed)).partition(
        b"\r\n\r\n"
    )
    assert b"transfer-encoding: chunked" in head.lower()
    assert b"content-length" not in head.lower()
    assert b"data: [DONE]" in body


@pytest_twisted.ensureDeferred
async def test_a_form_encoded_post_goes_to_the_host_as_it_came(crossbar_before_answers):
    answers, port = crossbar_before_answers
    raw = b'{"content": "--x"}'  # JSON, labelled as a form Twisted's parsing would refuse
    answer = await raw_post(port, "/r/convo/tokenize", raw, "multipart/form-data; boundary=x")
    assert answer.startswith(b"HTTP/1.1 200")
    assert answers.bodies == [raw]


def _no_delay(transport) -> int:
    return transport.getHandle().getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


@pytest_twisted.ensureDeferred
async def test_client_and_host_connections_send_small_writes_at_once():
    accepted: list[ProxyChannel] = []

    class Channels(Factory):
        def buildProtocol(self, addr):
            channel = ProxyChannel()
            accepted.append(channel)
            return channel

    port = reactor.listenTCP(0, Channels(), interface="127.0.0.1")
    try:
        client = await connectProtocol(
            TCP4ClientEndpoint(reactor, "127.0.0.1", port.getHost().port), Protocol()
        )
        (channel,) = accepted
        assert _no_delay(channel.transport) != 0  # crossbar's side of a client's connection

        class URI:
            scheme, host, port_ = b"http", b"127.0.0.1", port.getHost().port

        uri = URI()
        uri.port = uri.port_
        upstream = (
            await HostEndpoints(reactor, 5.0)
            .endpointForURI(uri)
            .connect(Factory.forProtocol(Protocol))
        )
        assert _no_delay(upstream.transport) != 0  # crossbar's side of a host connection
        upstream.transport.loseConnection()
        client.transport.loseConnection()
    finally:
        await port.stopListening()
