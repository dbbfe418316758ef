"""A host that sends more than it was asked for, or answers before it has read the request,
never gets a request twice and never hands one client another's answer (issue 38): a kept
connection goes back to the pool only once the read that ended its answer is parsed whole,
rests there before it carries another request, and is never kept while its request is still
unsent. Told on the in-memory network, and on real sockets where the byte stream is the
point."""

import json

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from crossbar.wire import Outgoing, Upstream
from crossbar.wire.answer import read_body
from crossbar.wire.pool import PROBATION, QUIET, HostConnection, HostPool
from tests.support.memnet import CHAT_PATH, MODEL, Host, chat, start

ONE_HOST = {"convo": {"hosts": ["titan"], "default_model": MODEL}}


def answer_bytes(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


def error_of(client) -> dict:
    return json.loads(client.received.split(b"\r\n\r\n", 1)[1])["error"]


def test_bytes_after_an_answer_retire_its_connection_and_no_request_goes_twice():
    crossbar = start(ONE_HOST, hosts=("titan",), parallel=1)
    net = crossbar.net

    def answer_with_junk(host: Host) -> None:
        # One write: the answer, then bytes nobody asked for, in the same read.
        host.transport.write(answer_bytes(b'{"id": "a"}') + b"HTTP/1.1 200 OK\r\n")

    net.on_request["titan"] = lambda host: None
    first = crossbar.post(CHAT_PATH, chat("first"))
    waiting = [crossbar.post(CHAT_PATH, chat(f"w{i}")) for i in range(3)]  # queued behind it
    net.on_request["titan"] = answer_with_junk
    (holder,) = net.connections["titan"]
    answer_with_junk(holder)
    net.flush()
    assert first.status == 200 and all(c.status == 200 for c in waiting)
    sent = [h.requests() for h in net.connections["titan"]]
    assert sum(sent) == 4 and max(sent) == 1  # four requests, each on its own connection, once
    assert all(h.lost for h in net.connections["titan"])  # every one retired by its junk


def test_a_stale_second_answer_never_reaches_the_next_client():
    crossbar = start(ONE_HOST, hosts=("titan",))
    net = crossbar.net
    net.on_request["titan"] = lambda host: host.answer(b'{"id": "for-ann"}')
    ann = crossbar.post(CHAT_PATH, chat("ann's question"))
    assert ann.status == 200
    (first,) = net.connections["titan"]
    net.clock.advance(QUIET / 2)  # ben asks while ann's connection rests
    net.on_request["titan"] = lambda host: None
    ben = crossbar.post(CHAT_PATH, chat("ben's question"))
    first.answer(b'{"id": "for-ann, again"}')  # the host repeats itself on the old connection
    net.flush()
    assert first.lost  # bytes nobody asked for: that connection is retired
    (_, second) = net.connections["titan"]
    assert second.requests() == 1 and ben.status is None  # ben's went on another connection
    second.answer(b'{"id": "for-ben"}')
    net.flush()
    assert ben.status == 200 and b"for-ben" in ben.received and b"for-ann" not in ben.received


def test_a_host_answer_in_a_transfer_encoding_other_than_chunked_is_a_502():
    crossbar = start(ONE_HOST, hosts=("titan",))
    net = crossbar.net

    def gzip_coded(host: Host) -> None:
        host.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nxxxxx\r\n0\r\n\r\n"
        )

    net.on_request["titan"] = gzip_coded
    client = crossbar.post(CHAT_PATH, chat())
    assert client.status == 502
    error = error_of(client)
    assert error["code"] == "bad_gateway" and "reads only chunked" in error["message"]
    assert net.connections["titan"][0].lost
    assert crossbar.parts.hosts.healthy("titan")


# -- what the pool learns of a host, told on one connection and a Clock


def pooled(clock: Clock) -> tuple[HostPool, HostConnection]:
    pool = HostPool(clock, endpoints=None)
    connection = HostConnection()
    connection.pool = pool
    connection.origin, _ = pool.origin(b"http://host:8080/v1/chat/completions")
    connection.makeConnection(StringTransport())
    return pool, connection


def answered_once(connection: HostConnection, answer: bytes) -> None:
    connection.request(b"POST / HTTP/1.1\r\n\r\n", b"{}", False)
    connection.dataReceived(answer)


STREAM = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\ndata:\r\n0\r\n\r\n"
)


def test_after_a_stream_a_connection_waits_out_its_probation_until_the_host_is_known():
    clock = Clock()
    pool, connection = pooled(clock)
    origin = connection.origin
    answered_once(connection, STREAM)
    clock.advance(QUIET)
    assert pool.take(origin) is None  # does this host close after a stream? not known yet
    clock.advance(PROBATION - QUIET)
    assert pool.take(origin) is connection and origin.keeps_after_chunked  # it does not
    answered_once(connection, STREAM)
    clock.advance(QUIET)
    assert pool.take(origin) is connection  # known now: a stream's connection only rests


def test_a_host_that_closes_idle_connections_is_learned_and_not_raced():
    clock = Clock()
    pool, connection = pooled(clock)
    origin = connection.origin
    answered_once(connection, answer_bytes(b"{}"))
    clock.advance(5.0)
    connection.connectionLost()  # the host's keep-alive timeout: 5 s idle
    assert origin.idle_close == 5.0
    _, again = pooled(clock)
    again.pool, again.origin = pool, origin
    answered_once(again, answer_bytes(b"{}"))
    clock.advance(3.0)
    assert pool.take(origin) is again  # well within the host's 5 s
    answered_once(again, answer_bytes(b"{}"))
    clock.advance(4.0)
    assert pool.take(origin) is None and again.lost  # too near them: closed, not raced


# -- a host that answers before it has read the request, on real sockets


class EarlyAnswer(Protocol):
    """Answers 413 as soon as a request head is in, keeps the connection, reads no more."""

    def dataReceived(self, data: bytes) -> None:
        if b"\r\n\r\n" in data and not self.factory.answered:
            self.factory.answered = True
            self.transport.write(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\n\r\n")
            self.transport.pauseProducing()  # the rest of the upload is never read
        elif self.factory.answered and data.startswith(b"POST"):
            self.transport.write(answer_bytes(b'{"id": "second"}'))

    def connectionMade(self) -> None:
        self.factory.connections += 1


@pytest_twisted.ensureDeferred
async def test_a_connection_whose_upload_the_host_left_unread_is_never_reused():
    factory = Factory.forProtocol(EarlyAnswer)
    factory.answered, factory.connections = False, 0
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    upstream = Upstream(reactor, connect_timeout=5, idle_timeout=30)
    url = b"http://127.0.0.1:%d/v1/chat/completions" % port.getHost().port
    try:
        upload = b"x" * (32 * 1024 * 1024)  # more than the kernel's buffers hold
        first = await upstream.send(Outgoing(b"POST", url, [], upload))
        assert first.code == 413
        await read_body(first)
        origin, _ = upstream._pool.origin(url)
        assert origin.idle == []  # not kept: the upload still waits in front of it
        second = await upstream.send(Outgoing(b"POST", url, [], b"{}"))
        assert second.code == 200 and b"second" in await read_body(second)
        assert factory.connections == 2
    finally:
        await upstream.close()
        await port.stopListening()


def test_a_host_that_says_how_long_it_keeps_idle_connections_is_taken_at_its_word():
    clock = Clock()
    pool, connection = pooled(clock)
    origin = connection.origin
    answered_once(
        connection,
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nKeep-Alive: timeout=5, max=100\r\n\r\n{}",
    )
    assert origin.idle_close == 5.0  # llama-server's cpp-httplib says so on every answer
    clock.advance(3.0)
    assert pool.take(origin) is connection
    answered_once(connection, answer_bytes(b"{}"))
    clock.advance(3.75)
    assert pool.take(origin) is None and connection.lost
