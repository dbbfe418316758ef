"""A host that goes silent mid-answer for `upstream_idle_timeout` is cut then: counted from its
last byte, however many came before (the timer is moved on lazily, not reset per chunk)."""

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from crossbar.wire.relay import _Body


class Request:
    """What a relayed body writes to: the client's request."""

    def __init__(self) -> None:
        self.channel = object()
        self.written: list[bytes] = []

    def registerProducer(self, producer, streaming) -> None:
        pass

    def unregisterProducer(self) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.written.append(data)


def test_the_idle_timeout_counts_from_the_host_s_last_byte():
    clock, request, host = Clock(), Request(), StringTransport()
    body = _Body(request, clock, idle_timeout=10.0, write_timeout=30.0, on_data=lambda _: None)
    body.makeConnection(host)
    for _ in range(25):  # a chunk every 0.4 s for 10 s: never idle
        clock.advance(0.4)
        body.dataReceived(b"x")
    assert not body.timed_out and host.producerState == "producing"
    clock.advance(9.9)  # silent since its last chunk, not yet for 10 s
    assert not body.timed_out
    clock.advance(0.1)
    assert body.timed_out and host.producerState == "stopped"
    assert len(request.written) == 25


def test_a_paused_client_stops_the_idle_timer_and_resuming_starts_it_afresh():
    clock, request, host = Clock(), Request(), StringTransport()
    body = _Body(request, clock, idle_timeout=10.0, write_timeout=30.0, on_data=lambda _: None)
    body.makeConnection(host)
    body.pauseProducing()  # the client reads slowly: the host is not silent
    clock.advance(20.0)
    assert not body.timed_out
    body.resumeProducing()
    clock.advance(9.9)
    assert not body.timed_out
    clock.advance(0.1)
    assert body.timed_out
