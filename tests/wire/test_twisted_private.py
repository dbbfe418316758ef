"""Each private Twisted API crossbar uses (crossbar/twisted_private.py) still works as relied on:
an upgrade that moves one fails here, by name, instead of in a request."""

import pytest
from twisted.internet.task import Clock
from twisted.test.iosim import FakeTransport, connect
from twisted.web.client import Request
from twisted.web.http import HTTPChannel
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from crossbar.config.values import parse_config
from crossbar.proxy.site import ProxySite
from crossbar.wire.dialects import ErrorShape
from crossbar.wire.twisted_private import (
    RequestNotSent,
    connection_headers,
    quiet_pool,
    replace_chunked_decoder,
    request_line_path,
)
from crossbar.wire.upstream import classify


class _Server:
    """Collects a client's bytes; the test writes the answer."""

    def __init__(self):
        self.received = b""

    def makeConnection(self, transport):
        self.transport = transport

    def dataReceived(self, data):
        self.received += data

    def connectionLost(self, reason):
        pass


def _pool_connection():
    """A protocol the quiet pool builds, connected in memory to a server we drive."""
    pool = quiet_pool(Clock(), persistent=True)
    factory = pool._factory(lambda protocol: None, "test")
    client = factory.buildProtocol(None)
    server = _Server()
    pump = connect(server, FakeTransport(server, True), client, FakeTransport(client, False))
    return factory, client, server, pump


def test_the_pools_factory_is_quiet_and_builds_the_protocol_that_keeps_connection_headers():
    factory, client, server, pump = _pool_connection()
    assert factory.noisy is False
    responses = []
    d = client.request(Request(b"GET", b"/", Headers({b"host": [b"h"]}), None, True))
    d.addCallback(responses.append)
    pump.flush()
    server.transport.write(
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\n"
        b"Content-Length: 0\r\n\r\n"
    )
    pump.flush()
    (response,) = responses
    assert IResponse.providedBy(response)
    assert response.headers.hasHeader(b"x-secret")  # Twisted keeps what Connection names
    kept = connection_headers(response)
    assert kept is not None and kept.getRawHeaders(b"connection") == [b"keep-alive, X-Secret"]


def test_a_connection_no_longer_idle_refuses_a_request_with_request_not_sent():
    _, client, _, _ = _pool_connection()
    request = Request(b"GET", b"/", Headers({b"host": [b"h"]}), None, True)
    client.request(request).addErrback(lambda f: None)  # the connection is now busy
    failures = []
    client.request(request).addErrback(failures.append)
    (failure,) = failures
    assert failure.check(RequestNotSent)
    mapped = classify(failure, reused=True)
    assert (mapped.reason, mapped.reused, mapped.connecting) == ("reset", True, False)


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        (b"/r/convo/v1/messages", ErrorShape.ANTHROPIC),
        (b"/r/convo/v1/chat/completions", ErrorShape.OPENAI),
    ],
)
def test_the_request_line_path_is_known_while_the_headers_arrive(path, shape):
    config = parse_config(
        {
            "hosts": {"h": {"url": "http://h:1", "models": ["m"]}},
            "routes": {"convo": {"hosts": ["h"]}},
        }
    )
    site = ProxySite(None, config, reactor=Clock())
    site.max_body = 10
    channel = site.buildProtocol(None)
    seen = []
    original = channel.requestFactory

    def factory(*args, **kwargs):
        request = original(*args, **kwargs)
        real = request.gotLength

        def got_length(length):
            seen.append((request_line_path(channel), site.refusal(channel).shape))
            real(length)

        request.gotLength = got_length
        return request

    channel.requestFactory = factory
    transport = FakeTransport(channel, isServer=True)
    channel.makeConnection(transport)
    channel.dataReceived(b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 99\r\n\r\n")
    assert seen == [(path, shape)]
    answer = b"".join(transport.stream)
    assert answer.startswith(b"HTTP/1.1 413 Payload Too Large")
    if shape is ErrorShape.ANTHROPIC:
        assert b'"type": "request_too_large"' in answer
    else:
        assert b'"code": 413' in answer


def test_a_chunked_bodys_decoder_is_replaced_with_twisteds_callbacks():
    channel = HTTPChannel()
    channel.makeConnection(FakeTransport(channel, isServer=True))
    channel.dataReceived(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    twisteds = channel._transferDecoder
    replaced = replace_chunked_decoder(channel, lambda data, finish: (data, finish))
    assert replaced and channel._transferDecoder == (
        twisteds.dataCallback,
        twisteds.finishCallback,
    )
    assert twisteds.dataCallback == channel.requests[-1].handleContentChunk
    other = HTTPChannel()
    other.makeConnection(FakeTransport(other, isServer=True))
    other.dataReceived(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n")
    assert not replace_chunked_decoder(other, lambda data, finish: None)
