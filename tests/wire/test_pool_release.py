"""A kept connection tells its caller the moment the host's answer has all been read, before
the last of it is relayed: the slot it held goes to the next request first (issue 37, item 6).
The connection itself goes back to the pool once the read that ended the answer is parsed
whole, and rests there (`QUIET`) before it carries another request (issue 38)."""

from twisted.internet.protocol import Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from crossbar.wire.pool import QUIET, HostConnection, HostPool

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n"


class Recorder(Protocol):
    def __init__(self, events: list) -> None:
        self.events = events

    def dataReceived(self, data: bytes) -> None:
        self.events.append(("body", data))

    def connectionLost(self, reason=None) -> None:
        self.events.append("end")


CLOCK = Clock()  # each test's pool rests its connections on it


def kept_connection() -> tuple[HostPool, HostConnection, StringTransport]:
    pool = HostPool(CLOCK, endpoints=None)
    connection = HostConnection()
    connection.pool = pool
    connection.origin, _ = pool.origin(b"http://host:8080/v1/chat/completions")
    transport = StringTransport()
    connection.makeConnection(transport)
    return pool, connection, transport


def send(connection: HostConnection, events: list, on_done) -> None:
    answer = connection.request(b"POST / HTTP/1.1\r\n\r\n", b"{}", False, on_done=on_done)

    def answered(response) -> None:
        events.append("head")
        response.deliverBody(Recorder(events))

    answer.addCallback(answered)


def test_an_answer_that_ends_in_one_read_frees_its_caller_before_it_is_relayed():
    pool, connection, _ = kept_connection()
    events: list = []

    def done() -> None:  # the connection is kept, resting, when the caller hears
        events.append(("done", connection in connection.origin.idle))

    send(connection, events, done)
    connection.dataReceived(ANSWER + b"okay")
    assert events == [("done", True), "head", ("body", b"okay"), "end"]
    assert pool.take(connection.origin) is None  # it rests first
    CLOCK.advance(QUIET)
    assert pool.take(connection.origin) is connection


def test_a_body_is_relayed_as_it_comes_and_the_caller_freed_when_it_ends():
    _, connection, _ = kept_connection()
    events: list = []
    send(connection, events, lambda: events.append("done"))
    connection.dataReceived(ANSWER + b"ok")
    assert events == ["head", ("body", b"ok")]
    connection.dataReceived(b"ay")
    assert events == ["head", ("body", b"ok"), "done", ("body", b"ay"), "end"]


def test_a_body_read_whole_can_no_longer_pause_or_stop_the_connection():
    pool, connection, transport = kept_connection()
    events: list = []
    bodies: list = []

    def answered(response) -> None:
        recorder = Recorder(events)
        bodies.append(recorder)
        response.deliverBody(recorder)

    connection.request(b"POST / HTTP/1.1\r\n\r\n", b"{}", False, on_done=lambda: None).addCallback(
        answered
    )
    connection.dataReceived(ANSWER + b"okay")
    (body,) = bodies
    body.transport.pauseProducing()
    body.transport.stopProducing()  # its client left after the answer was read: nothing to stop
    assert transport.producerState == "producing" and not transport.disconnecting
    CLOCK.advance(QUIET)
    assert pool.take(connection.origin) is connection


def released(pool: HostPool, n: int) -> list[HostConnection]:
    """`n` connections to one host, each answering and going back to `pool` now."""
    connections = []
    for _ in range(n):
        connection = HostConnection()
        connection.pool = pool
        connection.origin, _ = pool.origin(b"http://host:8080/v1/chat/completions")
        connection.makeConnection(StringTransport())
        send(connection, [], lambda: None)
        connection.dataReceived(ANSWER + b"okay")
        connections.append(connection)
    return connections


def test_a_busy_host_s_resting_connections_are_kept_beyond_per_host_not_closed_and_reopened():
    pool = HostPool(CLOCK, endpoints=None, per_host=4)
    # Ten answers end within one QUIET: none can carry a request yet, so none is closed for
    # being over per_host (each would have been reopened by the next request).
    resting = released(pool, 10)
    assert not any(c.lost for c in resting)
    CLOCK.advance(QUIET)
    # Rested, ten are more than per_host: the next ones released are closed...
    later = released(pool, 2)
    assert all(c.lost for c in later)
    # ...and the rested ones are taken, warmest first, until none is left.
    taken = [pool.take(resting[0].origin) for _ in range(11)]
    assert taken == [*reversed(resting), None]


def test_resting_connections_are_kept_up_to_a_bound_all_the_same():
    pool = HostPool(CLOCK, endpoints=None, per_host=2)
    connections = released(pool, 20)
    assert [c.lost for c in connections] == [False] * 8 + [True] * 12
