"""Kept HTTP/1.1 connections to the hosts, and the answers read from them by llhttp (Node.js's
parser, through httptools), in place of twisted.web's Agent and its pool.

A connection carries one request at a time; once its answer has all been read it goes back to
its host's idle list (at most `per_host` kept; the rest close), and one idle for `keep_idle`
seconds closes. A host that closes its connection after every streamed (chunked) answer, as
llama-server does while it says `Keep-Alive`, is learned the first time one such connection
goes within a second of its stream's end: from then on a connection is not kept after a
chunked answer of that host (the next request would meet its close and be sent again), and a
spare is opened as such an answer begins, so the request that takes its slot next finds one
ready. Every request is one write of its head (and body). What the answer says goes
to the caller as a `HostResponse`, which reads like twisted.web's IResponse (code, phrase,
headers, length, deliverBody) so the relay stays what it was.

How an answer can fail, each its own exception: the connection closed before the answer's head
had all come (`HostClosed`), or the bytes were not HTTP (`NotHTTP`: a bad status line or header,
more than 100 headers or 64 KiB of head, a bad length). A body cut short ends its protocol with
`ResponseFailed`; one read to the close (no length, not chunked) with `PotentialDataLoss`;
a whole one with `ResponseDone`, as twisted.web's client does.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import httptools
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IPushProducer
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import URI, ResponseDone, ResponseFailed
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import UNKNOWN_LENGTH, IAgentEndpointFactory
from zope.interface import implementer

from crossbar.wire.headers import RawHeaders
from crossbar.wire.twisted_private import write_now

MAX_RESPONSE_HEADERS = 100
MAX_RESPONSE_HEAD_BYTES = 64 * 1024
# Filed apart from the answer's headers, as twisted.web's client files them: they describe
# this connection, and a proxy must not pass them on (RFC 9110, 7.6.1).
_CONNECTION_HEADERS = frozenset(
    {
        b"content-length",
        b"connection",
        b"keep-alive",
        b"te",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"proxy-connection",
    }
)
_MAX_ORIGINS = 4096
# A connection the host closes this soon after a chunked answer's end closed because of it.
_CLOSED_AFTER = 1.0
log = Logger(
    namespace="crossbar.upstream"
)  # parsed host URLs kept (one per configured host in practice)


class HostClosed(Exception):
    """The connection ended before the answer's head had all come: `answered` says whether
    any byte of it had."""

    def __init__(self, answered: bool, reason: Failure | None = None) -> None:
        super().__init__("the host closed the connection" + (" mid-answer" if answered else ""))
        self.answered = answered
        self.reason = reason


class ReaderFault(Exception):
    """The body's reader (crossbar's relay) raised; logged where it happened."""


class NotHTTP(Exception):
    """What came back is not an HTTP/1.x answer: `detail` says how."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


@implementer(IPushProducer)
class _BodyTransport:
    """What a body's protocol holds as its transport: pause, resume or stop the host's
    connection under it, while its answer is still being read (once it has all been read, the
    connection may carry the next request already: it is no longer this body's)."""

    def __init__(self, connection: HostConnection, response: HostResponse) -> None:
        self._connection = connection
        self._response = response

    def pauseProducing(self) -> None:
        if not self._response.read_whole:
            self._connection.pause()

    def resumeProducing(self) -> None:
        if not self._response.read_whole:
            self._connection.resume()

    def stopProducing(self) -> None:
        if not self._response.read_whole:
            self._connection.stop()


class HostResponse:
    """An answer's status and headers, and its body for whoever `deliverBody` is given."""

    def __init__(
        self,
        connection: HostConnection,
        version: bytes,
        code: int,
        phrase: bytes,
        headers: RawHeaders,
        connection_headers: RawHeaders,
        length: int | object,
    ) -> None:
        self.version = (b"HTTP", 1, 1 if version == b"1.1" else 0)
        self.code = code
        self.phrase = phrase
        self.headers = headers
        self.connection_headers = connection_headers
        self.length = length
        self.read_whole = False  # the host's answer has all been read (its body may be held)
        self._connection = connection
        self._protocol: Any = None
        self._pending: list[bytes] = []
        self._end: Failure | None = None

    def deliverBody(self, protocol: Any) -> None:
        """Give `protocol` the body: what came already at once, the rest as it comes, then
        `connectionLost` with why it ended."""
        self._protocol = protocol
        protocol.makeConnection(_BodyTransport(self._connection, self))
        pending, self._pending = self._pending, []
        for data in pending:
            protocol.dataReceived(data)
        if self._end is not None:
            protocol.connectionLost(self._end)

    def data(self, data: bytes) -> None:
        if self._protocol is not None:
            self._protocol.dataReceived(data)
        else:
            self._pending.append(data)

    def end(self, reason: Failure) -> None:
        if self._end is not None:
            return
        self._end = reason
        if self._protocol is not None:
            self._protocol.connectionLost(reason)


class _Reading:
    """llhttp's callbacks for one answer: its status line and headers as they come, then its
    body to the connection's current response. A reader whose answer ended (and whose
    connection may carry the next request already) takes nothing more.

    While one read is parsed, what it brings (the head, body pieces, the end) is `held` and
    passed on once the read is parsed, so that an answer that ends in it calls `on_done`
    (the host is free: the caller's slot goes to its next request) before its last bytes are
    relayed."""

    __slots__ = (
        "chunked",
        "connection",
        "done",
        "failure",
        "head_bytes",
        "head_only",
        "headers",
        "held",
        "informational",
        "on_done",
        "parser",
        "response",
        "status",
    )

    def __init__(
        self,
        connection: HostConnection,
        head_only: bool,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self.connection = connection
        self.head_only = head_only
        self.on_done = on_done
        self.held: list[Callable[[], None]] | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.status = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_bytes = 0
        self.informational = False
        self.chunked = False
        self.done = False
        self.failure: Exception | None = None
        self.response: HostResponse | None = None

    def on_message_begin(self) -> None:
        if self.done:
            self.failure = NotHTTP("bytes after the answer")
            raise self.failure

    def on_status(self, status: bytes) -> None:
        self.status += status
        self._count(len(status))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))
        self._count(len(name) + len(value) + 4)
        if len(self.headers) > MAX_RESPONSE_HEADERS:
            self.failure = NotHTTP("more than 100 response headers")
            raise self.failure

    def _count(self, n: int) -> None:
        self.head_bytes += n
        if self.head_bytes > MAX_RESPONSE_HEAD_BYTES:
            self.failure = NotHTTP("response headers over 64 KiB")
            raise self.failure

    def on_headers_complete(self) -> None:
        code = self.parser.get_status_code()
        if 100 <= code < 200:
            self.informational = True  # 100 Continue and the like: the answer comes after
            return
        plain, connection = [], []
        length: int | object = UNKNOWN_LENGTH
        for name, value in self.headers:
            low = name.lower()
            if low in _CONNECTION_HEADERS:
                connection.append((name, value))
                if low == b"content-length":
                    length = int(value)  # llhttp took it: digits, one value
                elif low == b"transfer-encoding":
                    self.chunked = True
            else:
                plain.append((name, value))
        headers, kept = RawHeaders(plain), RawHeaders(connection)
        if self.chunked:
            length = UNKNOWN_LENGTH
        if code in (204, 304) or self.head_only:
            length = 0
        version = self.parser.get_http_version().encode("ascii")
        response = HostResponse(self.connection, version, code, self.status, headers, kept, length)
        self.response = response
        self.connection.answered(self, response)

    def on_body(self, body: bytes) -> None:
        if self.response is not None and not self.done:
            if self.held is not None:
                self.held.append(partial(self.relay_body, self.response, body))
                return
            try:
                self.response.data(body)
            except Exception:
                # A fault in whoever reads the body, not in the host's bytes: it is logged as
                # crossbar's, and the answer ends with it.
                log.failure("reading a host's answer failed inside crossbar")
                self.failure = ReaderFault()
                raise

    def relay_body(self, response: HostResponse, body: bytes) -> None:
        """A held piece of the body, passed on after its read was parsed: a fault in its
        reader ends the answer (and the connection, unless it was all read and may carry
        the next request already)."""
        try:
            response.data(body)
        except Exception:
            log.failure("reading a host's answer failed inside crossbar")
            if self.held is not None:
                self.held.clear()
            if self is self.connection._reading:
                self.connection._fail(self, ReaderFault())
            else:
                response.end(Failure(ResponseFailed([Failure(ReaderFault())])))

    def on_message_complete(self) -> None:
        if self.informational:
            self.informational = False
            self.status, self.headers, self.head_bytes = b"", [], 0
            return
        if not self.done:
            self.connection.ended(self, self.parser.should_keep_alive())

    def sized(self) -> bool:
        """The body's end is known (a length, or chunked), not the connection's close."""
        response = self.response
        return self.chunked or (response is not None and response.length is not UNKNOWN_LENGTH)


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
        self._reading: _Reading | None = None
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
        self._reading = _Reading(self, head_only, on_done)
        self._received = False
        write_now(self.transport, (data, body) if body else (data,))
        return self._answer

    def _cancel(self, answer: Deferred[HostResponse]) -> None:
        self._answer = None  # the Deferred fails with CancelledError; the connection goes
        self.abort()

    def dataReceived(self, data: bytes) -> None:
        reading = self._reading
        if reading is None or reading.done:
            # Bytes nobody asked for: the connection cannot be trusted with another request.
            self.abort()
            return
        self._received = True
        failure: Exception | None = None
        reading.held = held = []
        try:
            reading.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            failure = NotHTTP("the host switched protocols")
        except httptools.HttpParserError as e:
            failure = reading.failure or NotHTTP(_unreadable(reading, e))
        # What this read brought, in order; an answer that ended in it has called on_done first.
        for passed_on in held:  # a reader's fault clears the rest of it
            passed_on()
        reading.held = None
        if failure is not None:
            self._fail(reading, failure)

    def answered(self, reading: _Reading, response: HostResponse) -> None:
        """The answer's head is in."""
        answer, self._answer = self._answer, None
        origin = self.origin
        if reading.chunked and origin is not None and origin.closes_after_chunked:
            assert self.pool is not None
            self.pool.spare(origin)  # this one closes when the answer ends: one ready for next
        if reading.held is not None and not reading.head_only:
            if answer is not None:
                reading.held.append(partial(answer.callback, response))
            return
        if reading.head_only:
            # A HEAD's answer has no body whatever its length says: it ends here, and the
            # connection goes (llhttp cannot be told to skip the body).
            reading.done = True
            self._reading = None
            if answer is not None:
                answer.callback(response)
            response.end(Failure(ResponseDone()))
            self.abort()
            return
        if answer is not None:
            answer.callback(response)

    def ended(self, reading: _Reading, keep: bool) -> None:
        """The answer has all been read: the connection is free for the next request (kept
        first, so a request waiting on this answer's end can take it at once)."""
        reading.done = True
        self._reading = None
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
            if reading.held is not None:
                reading.held.append(partial(response.end, Failure(ResponseDone())))
            else:
                response.end(Failure(ResponseDone()))

    # -- the connection

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.lost = True
        if self.pool is not None:
            self.pool.forget(self)
            unanswered = self._reading is None or (self._answer is not None and not self._received)
            if self.after_chunked and unanswered:
                self.pool.closed_after_chunked(self)
        answer, self._answer = self._answer, None
        if answer is not None:
            answer.errback(HostClosed(self._received, reason))
            return
        reading, self._reading = self._reading, None
        if reading is None or reading.done or reading.response is None:
            return
        reading.done = True
        if not reading.sized():  # a body that runs to the close: it ended as the host meant
            reading.response.end(Failure(PotentialDataLoss()))
        else:
            reading.response.end(Failure(ResponseFailed([reason])))

    def _fail(self, reading: _Reading, error: Exception) -> None:
        if reading is not self._reading:  # garbage after an answer that ended: it goes
            self.abort()
            return
        reading.done = True
        self._reading = None
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
        if self._reading is not None:
            self.abort()

    def abort(self) -> None:
        if not self.lost and self.transport is not None:
            self.lost = True  # never handed out again, whatever comes before the close
            if self.pool is not None:
                self.pool.forget(self)
            self.transport.abortConnection()  # type: ignore[union-attr]


def _unreadable(reading: _Reading, error: Exception) -> str:
    """What llhttp could not read, in the words of where it stopped."""
    if not reading.status and not reading.headers:
        return f"bad status line or status code ({error})"
    return f"bad response head ({error})"


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


class _Collect(Protocol):
    def __init__(self, done: Deferred[bytes]) -> None:
        self._done = done
        self._parts: list[bytes] = []

    def dataReceived(self, data: bytes) -> None:
        self._parts.append(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if reason.check(ResponseDone, PotentialDataLoss):
            self._done.callback(b"".join(self._parts))
        else:
            self._done.errback(reason)


def read_body(response: HostResponse) -> Deferred[bytes]:
    """The whole body of `response`."""
    done: Deferred[bytes] = Deferred()
    response.deliverBody(_Collect(done))
    return done
