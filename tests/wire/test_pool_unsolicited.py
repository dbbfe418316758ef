"""A host that sends an answer nobody asked for (a stale second answer) loses the connection
it came on, is counted and logged, and is not trusted with kept connections for `DISTRUST`
seconds after its latest one: each request to it takes a new connection, closed after its
answer, so no later stale answer of it can be read as another client's (issue 47, item 7).
What HTTP/1.1 cannot tell apart, a stale answer that arrives after the next request was
written, is told here too. On the in-memory network, and on one connection and a Clock."""

import socket

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import globalLogPublisher

from crossbar.wire.pool import DISTRUST, QUIET, HostConnection, HostPool, PoolCounts
from tests.support.memnet import CHAT_PATH, MODEL, chat, start

ONE_HOST = {"convo": {"hosts": ["titan"], "default_model": MODEL}}
URL = "http://titan:8080"


def answered_by(text: bytes):
    return lambda host: host.answer(b'{"id": "' + text + b'"}')


def asked_to_close(host) -> bool:
    return b"\r\nConnection: close\r\n" in host.received


def test_a_stale_answer_during_the_rest_retires_the_connection_and_distrusts_its_host():
    crossbar = start(ONE_HOST, hosts=("titan",))
    net, upstream = crossbar.net, crossbar.parts.upstream
    net.on_request["titan"] = answered_by(b"for-ann")
    assert crossbar.post(CHAT_PATH, chat("ann")).status == 200
    (first,) = net.connections["titan"]
    net.clock.advance(QUIET / 2)
    first.answer(b'{"id": "for-ann, again"}')  # while the connection rests
    net.flush()
    assert first.lost
    assert upstream.counts(URL) == PoolCounts(unsolicited=1, distrusted=True)
    assert 'crossbar_upstream_unsolicited_total{host="titan"} 1.0' in (
        crossbar.parts.metrics.render().decode()
    )
    # Distrusted: each request a new connection, which asks to close and closes after its answer.
    for name in (b"ben", b"cat"):
        net.on_request["titan"] = answered_by(b"for-" + name)
        client = crossbar.post(CHAT_PATH, chat(name.decode()))
        assert client.status == 200 and b"for-" + name in client.received
        newest = net.connections["titan"][-1]
        assert newest.requests() == 1 and asked_to_close(newest) and newest.lost
        net.clock.advance(QUIET)
    assert len(net.connections["titan"]) == 3


def test_a_host_is_trusted_again_after_distrust_seconds_without_one():
    crossbar = start(ONE_HOST, hosts=("titan",))
    net, upstream = crossbar.net, crossbar.parts.upstream
    net.on_request["titan"] = answered_by(b"for-ann")
    crossbar.post(CHAT_PATH, chat("ann"))
    (first,) = net.connections["titan"]
    first.answer(b'{"id": "for-ann, again"}')
    net.flush()
    net.run(DISTRUST - 1)
    assert upstream.counts(URL).distrusted
    net.run(1)
    assert upstream.counts(URL) == PoolCounts(unsolicited=1, distrusted=False)
    net.on_request["titan"] = answered_by(b"for-ben")
    crossbar.post(CHAT_PATH, chat("ben"))
    kept = net.connections["titan"][-1]
    assert not asked_to_close(kept) and not kept.lost  # kept for the next request again
    net.clock.advance(2 * QUIET)  # (a clock at 600 s adds QUIET a hair short)
    crossbar.post(CHAT_PATH, chat("cat"))
    assert kept.requests() == 2 and len(net.connections["titan"]) == 2


def test_a_stale_answer_to_a_connection_idle_in_the_pool_retires_it_too():
    crossbar = start(ONE_HOST, hosts=("titan",))
    net, upstream = crossbar.net, crossbar.parts.upstream
    net.on_request["titan"] = answered_by(b"for-ann")
    crossbar.post(CHAT_PATH, chat("ann"))
    (first,) = net.connections["titan"]
    net.clock.advance(30.0)  # long rested, idle
    first.answer(b'{"id": "for-ann, again"}')
    net.flush()
    assert first.lost and upstream.counts(URL).unsolicited == 1
    net.on_request["titan"] = answered_by(b"for-ben")
    ben = crossbar.post(CHAT_PATH, chat("ben"))
    assert b"for-ben" in ben.received and b"for-ann" not in ben.received


def test_what_http_1_1_cannot_tell_apart_happens_once_then_the_host_is_distrusted():
    crossbar = start(ONE_HOST, hosts=("titan",))
    net, upstream = crossbar.net, crossbar.parts.upstream
    net.on_request["titan"] = answered_by(b"for-ann")
    crossbar.post(CHAT_PATH, chat("ann"))
    (first,) = net.connections["titan"]
    net.clock.advance(QUIET)
    net.on_request["titan"] = lambda host: None
    ben = crossbar.post(CHAT_PATH, chat("ben"))
    assert first.requests() == 2  # ben's request went on the rested connection...
    # ...and the host's stale answer to ann arrives only now, before ben's: nothing in the
    # bytes says whose it is. Ben gets it (the window the rest and the peek only narrow).
    first.answer(b'{"id": "for-ann, again"}')
    net.flush()
    assert b"for-ann, again" in ben.received
    first.answer(b'{"id": "for-ben"}')  # ben's own answer comes after an answer that ended
    net.flush()
    assert first.lost and upstream.counts(URL) == PoolCounts(unsolicited=1, distrusted=True)
    # From the first one seen on, no connection of that host carries a second request.
    net.on_request["titan"] = answered_by(b"for-cat")
    net.clock.advance(QUIET)
    cat = crossbar.post(CHAT_PATH, chat("cat"))
    assert b"for-cat" in cat.received
    assert [h.requests() for h in net.connections["titan"]] == [2, 1]


# -- on one connection and a Clock


def pooled(clock: Clock, pool: HostPool | None = None) -> tuple[HostPool, HostConnection]:
    pool = pool or HostPool(clock, endpoints=None)
    connection = HostConnection()
    connection.pool = pool
    connection.origin, _ = pool.origin(b"http://host:8080/v1/chat/completions")
    connection.makeConnection(StringTransport())
    return pool, connection


def answered_once(connection: HostConnection, extra: bytes = b"") -> None:
    connection.request(b"POST / HTTP/1.1\r\n\r\n", b"{}", False)
    connection.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}" + extra)


def test_bytes_after_an_answer_in_the_same_read_are_an_unsolicited_answer():
    clock = Clock()
    pool, connection = pooled(clock)
    answered_once(connection, extra=b"HTTP/1.1 200 OK\r\n")
    assert connection.lost and pool.counts("http://host:8080") == PoolCounts(1, True)


def test_nothing_the_host_sends_after_crossbar_gave_up_on_a_connection_counts():
    clock = Clock()
    pool, connection = pooled(clock)
    connection.request(b"POST / HTTP/1.1\r\n\r\n", b"{}", False).addErrback(lambda _: None).cancel()
    connection.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")  # the client left
    assert pool.counts("http://host:8080") == PoolCounts()


class SocketTransport(StringTransport):
    """A test transport over a real socket, which the pool peeks into."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock

    def getHandle(self) -> socket.socket:
        return self.sock


def on_a_socket(clock: Clock) -> tuple[HostPool, HostConnection, socket.socket]:
    ours, hosts = socket.socketpair()
    ours.setblocking(False)
    pool = HostPool(clock, endpoints=None)
    connection = HostConnection()
    connection.pool = pool
    connection.origin, _ = pool.origin(b"http://host:8080/")
    connection.makeConnection(SocketTransport(ours))
    answered_once(connection)
    clock.advance(QUIET)
    return pool, connection, hosts


def test_a_kept_connection_with_bytes_waiting_unread_when_taken_is_retired_not_used():
    clock = Clock()
    pool, connection, hosts = on_a_socket(clock)
    try:
        hosts.send(b"HTTP/1.1 200 OK\r\n")  # come, but not read by the reactor yet
        assert pool.take(connection.origin) is None and connection.lost
        assert pool.counts("http://host:8080") == PoolCounts(1, True)
    finally:
        hosts.close()
        connection.socket.close()


def test_a_kept_connection_the_host_closed_unread_is_retired_and_not_counted():
    clock = Clock()
    pool, connection, hosts = on_a_socket(clock)
    hosts.close()
    try:
        assert pool.take(connection.origin) is None and connection.lost
        assert pool.counts("http://host:8080") == PoolCounts()
    finally:
        connection.socket.close()


def test_a_kept_connection_with_nothing_waiting_is_used():
    clock = Clock()
    pool, connection, hosts = on_a_socket(clock)
    try:
        assert pool.take(connection.origin) is connection
    finally:
        hosts.close()
        connection.socket.close()


def test_unsolicited_answers_are_logged_at_start_once_a_minute_and_at_the_end():
    clock = Clock()
    events: list[dict] = []

    def heard(event: dict) -> None:
        if event.get("log_namespace") == "crossbar.upstream":
            events.append(event)

    globalLogPublisher.addObserver(heard)
    try:
        pool, connection = pooled(clock)
        for _ in range(5):  # five within a minute: one line
            answered_once(connection, extra=b"HTTP/1.1 200 OK\r\n")
            _, connection = pooled(clock, pool)
            clock.advance(1)
        assert len(events) == 1 and events[0]["log_level"].name == "warn"
        clock.advance(60)
        answered_once(connection, extra=b"HTTP/1.1 200 OK\r\n")
        assert len(events) == 2 and (events[1]["count"], events[1]["total"]) == (5, 6)
        clock.advance(DISTRUST)
        assert len(events) == 3 and events[2]["log_level"].name == "info"
        assert not pool.counts("http://host:8080").distrusted
        assert all(b"HTTP" not in repr(e).encode() for e in events)  # never the bytes
    finally:
        globalLogPublisher.removeObserver(heard)
