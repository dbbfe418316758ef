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
