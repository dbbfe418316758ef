"""Kept HTTP/1.1 connections to the hosts, in place of twisted.web's Agent and its pool; the
answers they carry are read by answer.py.

A connection carries one request at a time; once its answer has all been read it goes back to
its host's idle list (at most `per_host` kept; the rest close), and one idle for `keep_idle`
seconds closes. A host that closes its connection after every streamed (chunked) answer, as
llama-server does while it says `Keep-Alive`, is learned the first time one such connection
goes within a second of its stream's end: from then on a connection is not kept after a
chunked answer of that host (the next request would meet its close and be sent again), and a
spare is opened as such an answer begins, so the request that takes its slot next finds one
ready. Every request is one write of its head (and body). The answer's head, body and end,
as one read brings them, are passed on once that read is parsed: an answer that ends in it
frees its caller (`on_done`) before its last bytes are relayed.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import httptools
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import URI, ResponseDone, ResponseFailed
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import IAgentEndpointFactory

from crossbar.wire.answer import HostClosed, HostResponse, NotHTTP, Reading
from crossbar.wire.twisted_private import write_now

_MAX_ORIGINS = 4096  # parsed host URLs kept (one per configured host in practice)
# A connection the host closes this soon after a chunked answer's end closed because of it.
_CLOSED_AFTER = 1.0
log = Logger(namespace="crossbar.upstream")


class HostConnection(Protocol):
    """One connection to a host: one request at a time, its answer parsed as it comes."""

    def __init__(self) -> None:
        self.pool: HostPool | None = None
        self.origin: _Origin | None = None
        self.lost = False
        self.idle_since = 0.0
        self.after_chunked = False  # its last answer was chunked
        self.expiry: IDelayedCall | None = None
        self._answer: Deferred[HostResponse] | None = None
        self.reading: Reading | None = None  # the answer it reads now
        self._received = False  # a byte of the answer came
        self._paused = False

    # -- one request

    def request(
        self,
        data: bytes,
        body: bytes | None,
        head_only: bool,
        on_done: Callable[[], None] | None = None,
    ) -> Deferred[HostResponse]:
        """Write a request (its head `data`, then `body`); fires with the answer once its
        head is in, or fails (HostClosed, NotHTTP). `on_done` is called once the answer has
        all been read and the connection is free, before the end of it is relayed."""
        self._answer = Deferred(self._cancel)
        self.reading = Reading(self, head_only, on_done)
        self._received = False
        write_now(self.transport, (data, body) if body else (data,))
        return self._answer

    def _cancel(self, answer: Deferred[HostResponse]) -> None:
        self._answer = None  # the Deferred fails with CancelledError; the connection goes
        self.abort()

    def dataReceived(self, data: bytes) -> None:
        reading = self.reading
        if reading is None or reading.done:
            # Bytes nobody asked for: the connection cannot be trusted with another request.
            self.abort()
            return
        self._received = True
        failure: Exception | None = None
        try:
            reading.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            failure = NotHTTP("the host switched protocols")
        except httptools.HttpParserError as e:
            failure = reading.failure or NotHTTP(reading.unreadable(e))
        reading.pass_on()  # an answer that ended in this read has called on_done first
        if failure is not None:
            self.fail(reading, failure)

    def answered(self, reading: Reading, response: HostResponse) -> None:
        """The answer's head is in."""
        answer, self._answer = self._answer, None
        origin = self.origin
        if reading.chunked and origin is not None and origin.closes_after_chunked:
            assert self.pool is not None
            self.pool.spare(origin)  # this one closes when the answer ends: one ready for next
        if reading.head_only:
            # A HEAD's answer has no body whatever its length says: it ends here, and the
            # connection goes (llhttp cannot be told to skip the body).
            reading.done = True
            self.reading = None
            if answer is not None:
                answer.callback(response)
            response.end(Failure(ResponseDone()))
            self.abort()
        elif answer is not None:
            reading.held.append(partial(answer.callback, response))

    def ended(self, reading: Reading, keep: bool) -> None:
        """The answer has all been read: the connection is free for the next request (kept
        first, so a request waiting on this answer's end can take it at once)."""
        reading.done = True
        self.reading = None
        origin = self.origin
        self.after_chunked = reading.chunked
        if reading.chunked and origin is not None and origin.closes_after_chunked:
            keep = False  # the host closes it now: a request on it would be sent twice
        if keep and self.pool is not None:
            self.pool.release(self)
        else:
            self.abort()
        response = reading.response
        if response is not None:
            response.read_whole = True
        if reading.on_done is not None:
            reading.on_done()
        if response is not None:
            reading.held.append(partial(response.end, Failure(ResponseDone())))

    # -- the connection

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.lost = True
        if self.pool is not None:
            self.pool.forget(self)
            unanswered = self.reading is None or (self._answer is not None and not self._received)
            if self.after_chunked and unanswered:
                self.pool.closed_after_chunked(self)
        answer, self._answer = self._answer, None
        if answer is not None:
            answer.errback(HostClosed(self._received, reason))
            return
        reading, self.reading = self.reading, None
        if reading is None or reading.done or reading.response is None:
            return
        reading.done = True
        if not reading.sized():  # a body that runs to the close: it ended as the host meant
            reading.response.end(Failure(PotentialDataLoss()))
        else:
            reading.response.end(Failure(ResponseFailed([reason])))

    def fail(self, reading: Reading, error: Exception) -> None:
        """The answer `reading` reads failed with `error`: whoever waits hears it, and the
        connection goes."""
        if reading is not self.reading:  # garbage after an answer that ended: it goes
            self.abort()
            return
        reading.done = True
        self.reading = None
        answer, self._answer = self._answer, None
        self.abort()
        if answer is not None:
            answer.errback(error)
        elif reading.response is not None:
            reading.response.end(Failure(ResponseFailed([Failure(error)])))

    def pause(self) -> None:
        if not self._paused and not self.lost:
            self._paused = True
            self.transport.pauseProducing()  # type: ignore[union-attr]

    def resume(self) -> None:
        if self._paused and not self.lost:
            self._paused = False
            self.transport.resumeProducing()  # type: ignore[union-attr]

    def stop(self) -> None:
        """The body's reader gives up: the answer is dropped with its connection."""
        if self.reading is not None:
            self.abort()

    def abort(self) -> None:
        if not self.lost and self.transport is not None:
            self.lost = True  # never handed out again, whatever comes before the close
            if self.pool is not None:
                self.pool.forget(self)
            self.transport.abortConnection()  # type: ignore[union-attr]


class _Factory(Factory):
    noisy = False  # no "Starting factory" line per connection
    protocol = HostConnection


class _Origin:
    """A host URL's scheme, host and port, parsed once: its endpoint and Host header."""

    __slots__ = ("closes_after_chunked", "host", "idle", "key", "sparing", "uri")

    def __init__(self, origin: bytes) -> None:
        self.uri = URI.fromBytes(origin + b"/")
        self.key = origin
        self.host = origin.split(b"//", 1)[-1]  # the authority as configured: host[:port]
        self.idle: list[HostConnection] = []
        self.closes_after_chunked = False  # learned: see the module doc
        self.sparing = False  # a spare connection is being opened


class HostPool:
    """Kept connections per host URL; `request` sends one request on one of them."""

    def __init__(
        self,
        clock: Any,
        endpoints: IAgentEndpointFactory,
        per_host: int = 64,
        keep_idle: float = 240.0,
    ) -> None:
        self._clock = clock
        self.endpoints = endpoints
        self.per_host = per_host
        self.keep_idle = keep_idle
        self._factory = _Factory()
        self._origins: dict[bytes, _Origin] = {}
        self.connects = 0  # connections opened

    def origin(self, url: bytes) -> tuple[_Origin, bytes]:
        """The origin of `url` and its request target (path and query)."""
        start = url.find(b"//") + 2
        cut = url.find(b"/", start)
        base, target = (url, b"/") if cut < 0 else (url[:cut], url[cut:])
        origin = self._origins.get(base)
        if origin is None:
            if len(self._origins) >= _MAX_ORIGINS:
                self._origins.clear()
            origin = self._origins[base] = _Origin(base)
        return origin, target

    def take(self, origin: _Origin) -> HostConnection | None:
        """A kept connection to `origin`, the one used last (warmest), or None."""
        while origin.idle:
            connection = origin.idle.pop()
            if not connection.lost:
                return connection
        return None

    def connect(self, origin: _Origin) -> Deferred[HostConnection]:
        """A new connection to `origin`."""
        self.connects += 1
        endpoint = self.endpoints.endpointForURI(origin.uri)

        def made(connection: HostConnection) -> HostConnection:
            connection.pool, connection.origin = self, origin
            return connection

        return endpoint.connect(self._factory).addCallback(made)

    def spare(self, origin: _Origin) -> None:
        """Open a connection to `origin` ahead of need, unless one is idle or on its way."""
        if origin.sparing or any(not c.lost for c in origin.idle):
            return
        origin.sparing = True

        def ready(connection: HostConnection) -> None:
            origin.sparing = False
            self.release(connection)

        def failed(_: Failure) -> None:
            origin.sparing = False  # the request that needs it will connect and say why

        self.connect(origin).addCallbacks(ready, failed)

    def closed_after_chunked(self, connection: HostConnection) -> None:
        """The host closed `connection` with nothing asked of it or answered on it since its
        chunked answer: soon after that answer, the host closes after every one."""
        origin = connection.origin
        soon = self._clock.seconds() - connection.idle_since <= _CLOSED_AFTER
        if origin is not None and soon and not origin.closes_after_chunked:
            origin.closes_after_chunked = True
            log.info(
                "host {host} closes its connection after each streamed answer: a new one is "
                "opened ahead of the next request instead",
                host=origin.host.decode("ascii", "replace"),
            )

    def release(self, connection: HostConnection) -> None:
        """An answer was all read: keep its connection for the next request, or close it."""
        origin = connection.origin
        if origin is None or len(origin.idle) >= self.per_host:
            connection.abort()
            return
        connection.idle_since = self._clock.seconds()
        origin.idle.append(connection)
        if connection.expiry is None:
            connection.expiry = self._clock.callLater(self.keep_idle, self._expire, connection)

    def _expire(self, connection: HostConnection) -> None:
        # One timer per connection, moved on lazily: a request made on it costs no timer.
        connection.expiry = None
        if connection.lost:
            return
        origin = connection.origin
        idle = origin is not None and connection in origin.idle
        left = connection.idle_since + self.keep_idle - self._clock.seconds()
        if idle and left <= 0:
            connection.abort()
            return
        wait = left if idle else self.keep_idle
        connection.expiry = self._clock.callLater(wait, self._expire, connection)

    def forget(self, connection: HostConnection) -> None:
        origin = connection.origin
        if origin is not None and connection in origin.idle:
            origin.idle.remove(connection)
        if connection.expiry is not None and connection.expiry.active():
            connection.expiry.cancel()
        connection.expiry = None

    def close(self) -> None:
        """Close every kept connection."""
        for origin in self._origins.values():
            idle, origin.idle = origin.idle, []
            for connection in idle:
                connection.abort()


def request_head(
    method: bytes,
    target: bytes,
    host: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes | None,
) -> bytes:
    """The bytes of a request's head."""
    lines = [method, b" ", target, b" HTTP/1.1\r\nHost: ", host, b"\r\n"]
    for name, value in headers:
        lines += (name, b": ", value, b"\r\n")
    if body is not None:
        lines.append(b"Content-Length: %d\r\n" % len(body))
    lines.append(b"\r\n")
    return b"".join(lines)
