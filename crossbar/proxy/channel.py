"""The HTTP/1.1 connections of crossbar's sites (the proxy's and the admin API's): request heads
read by llhttp (Node.js's parser, through httptools), bodies by length or by strict chunks,
deadlines for slow clients, and JSON answers where a request cannot be taken.

Each request goes to the site's `requestFactory` as twisted.web's HTTPChannel gives it (the
proxy's lean Request and Klein's Request alike): `gotLength`, each piece of the body, then
`requestReceived`; the request answers through `writeHeaders`, `write` and `requestDone`.

- The request line and headers must all arrive within `header_timeout` of their first byte,
  a body must not pause longer than `body_timeout` between bytes, and must all arrive within
  `body_deadline`, both counted from the end of its head (a body that never starts is closed
  like one that stops): else 408 and close. A head and body that come whole in one read
  (nearly all of them) arm no timer at all.
- An HTTP/1.1 request has exactly one Host header, an HTTP/1.0 one at most one (RFC 9112,
  3.2), else 400. A target in absolute form (`http://host/path`) is served by its path and
  query, its authority standing in for the Host header (3.2.2).
- Small writes go out at once (TCP_NODELAY, as nginx does).
- A request line over 16 KiB: 414; a header line over 16 KiB, more than 16 KiB of headers or
  more than 500 of them: 431; anything else llhttp refuses: 400. Each with crossbar's JSON
  error body, then the connection closes.
- Framings that two parsers could read two ways (the raw material of request smuggling) are
  400 too: a `Transfer-Encoding` other than one `chunked`, or beside a Content-Length, or on
  an HTTP/1.0 request; a folded header line (obs-fold); a line of the head that ends in a
  bare LF; and what proxy/chunks.py refuses in a chunked body.
- Pipelined requests are answered in order: while one is handled, up to 16 KiB more is read
  (so a client that leaves is seen at once), then reading pauses until it is answered. A
  connection starts at most `TURN_REQUESTS` requests per turn of the reactor, so a pipeline
  that crossbar answers itself (404s, model lists) takes turns with every other connection;
  while its answers wait to be read, the rest of its pipeline waits too.
- HTTP/1.1 connections persist unless the request says `Connection: close`; an HTTP/1.0
  request's connection closes after its answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import httptools
from twisted.internet import interfaces
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from zope.interface import implementer

from crossbar.config import format_duration
from crossbar.proxy.chunks import StrictChunks
from crossbar.proxy.framing import framing, not_http, origin_form
from crossbar.wire import ClientError, no_delay, phrase, pull_to_push, write_now

MAX_LINE = 16384  # a request line or one header line
MAX_HEADER_BYTES = 16384  # all header lines after the request line
MAX_HEADERS = 500
_EAGER = 16384  # bytes read ahead while a request is handled, before reading pauses
# Requests one connection may start in one turn of the reactor: a pipeline of requests answered
# at once (a 404, a models list) is answered this many at a time, other connections in between.
TURN_REQUESTS = 16
_CRLF = b"\r\n"
_END = b"\r\n\r\n"


class _Head:
    """One request head as llhttp reads it: the target and the header lines, in order."""

    __slots__ = ("headers", "url")

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))


@implementer(interfaces.IPushProducer)
class ProxyChannel(Protocol):
    """One client connection of a crossbar site (the site holds the timeouts and bounds)."""

    # Set by the site's buildProtocol (twisted.web.http.HTTPFactory and server.Site).
    site: Any = None
    requestFactory: Any = None
    factory: Any = None
    timeOut: float | None = None  # the site's idle timeout between requests
    callLater: Callable[..., IDelayedCall] | None = None

    def __init__(self) -> None:
        self.requests: list[Any] = []  # the request being read or answered (one at most)
        self.path = b""  # the target of the request arriving now, once its line is in
        self._phase = "idle"  # idle, head, body, handling
        self._head = b""  # the bytes of a head not yet whole
        self._ahead: list[bytes] = []  # bytes read while a request is handled
        self._ahead_size = 0
        self._left = 0  # body bytes still to come (a Content-Length body)
        self._chunks: StrictChunks | None = None  # the decoder of a chunked body
        self._command = b""
        self._version = b""
        self._persistent = True
        self._refused = False
        self._taking = False  # _take runs: a request answered within it ends inside it
        self._turn_left = TURN_REQUESTS  # requests this connection may still start this turn
        self._next_turn: IDelayedCall | None = None  # its pipeline goes on in the next turn
        self._timer: IDelayedCall | None = None  # the head's deadline, or the body's pause
        self._body_mark = 0.0  # when the body's last bytes (or its head) came
        self._deadline: IDelayedCall | None = None  # the whole body's
        self._idle: IDelayedCall | None = None
        self._last = 0.0  # when the last request ended (the idle timer's mark)
        self._request_producer: Any = None
        self._waiting_for_transport = False
        self._paused = False  # reading is paused (pipelined bytes, or the transport is full)
        self._rest = b""  # what followed a chunked body that just ended
        self._peer: Any = None
        self._secure = False

    # -- the connection

    def connectionMade(self) -> None:
        transport = self.transport
        no_delay(transport)
        transport.registerProducer(self, True)  # type: ignore[union-attr]
        # Asked of every request: the peer's address and TLS, fixed for the connection.
        self._peer = transport.getPeer()  # type: ignore[union-attr]
        self._secure = interfaces.ISSLTransport(transport, None) is not None
        self._mark_idle()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._disarm()
        if self._next_turn is not None and self._next_turn.active():
            self._next_turn.cancel()
        self._next_turn = None
        if self._idle is not None and self._idle.active():
            self._idle.cancel()
        self._idle = None
        requests, self.requests = self.requests, []
        for request in requests:
            request.connectionLost(reason)

    def dataReceived(self, data: bytes) -> None:
        if self._refused:
            return
        if self._phase == "handling" or self._next_turn is not None:
            self._read_ahead(data)
            return
        self._turn_left = TURN_REQUESTS
        self._take(data)

    def _take(self, data: bytes) -> None:
        """Read `data` into heads and bodies until it is used up, a request is handled, or
        this connection has started its share of requests for this turn of the reactor."""
        self._taking = True
        try:
            self._take_turn(data)
        finally:
            self._taking = False

    def _take_turn(self, data: bytes) -> None:
        while data and not self._refused:
            phase = self._phase
            if phase == "handling":
                self._read_ahead(data)
                return
            if phase == "body":
                data = self._body(data)
            elif phase == "idle" and (self._turn_left <= 0 or self._waiting_for_transport):
                # This connection had its share of the turn: the rest of its pipeline waits
                # for the next one, so other connections are read and answered in between.
                # While its answers wait to be read, it waits for them (resumeProducing).
                self._read_ahead(data)
                if not self._waiting_for_transport:
                    self._next_turn = self._later(0, self._turn)
                return
            else:
                data = self._head_bytes(data)
        if self._phase == "body" and not self._refused:
            # More of a body is due: its timers run from the end of its head, so a body that
            # never starts is closed like one that stops.
            self._body_pending()

    def _read_ahead(self, data: bytes) -> None:
        self._ahead.append(data)
        self._ahead_size += len(data)
        if self._ahead_size > _EAGER and not self._paused:
            # Enough read ahead: the client is told to wait (TCP back-pressure) until its
            # earlier request is answered.
            self._paused = True
            self.transport.pauseProducing()  # type: ignore[union-attr]

    # -- the head

    def _head_bytes(self, data: bytes) -> bytes:
        """Take `data` into the head arriving now; returns what follows the head once it is
        whole (b"" until then)."""
        if self._phase == "idle":
            if not self._head and data[:2] == _CRLF:
                data = data.lstrip(_CRLF)  # empty lines before a request line are skipped
                if not data:
                    return b""
            self._phase = "head"
            self.path = b""
        buffer = self._head + data if self._head else data
        end = buffer.find(_END)
        if end < 0:
            self._head = buffer
            self._check_partial(buffer)
            if self._timer is None and not self._refused:
                self._arm(self.site.header_timeout, "the request's headers did not arrive in time")
            return b""
        self._head = b""
        head, rest = buffer[: end + 4], buffer[end + 4 :]
        if self._timer is not None:
            self._disarm()
        self._read_head(head)
        return rest

    def _check_partial(self, buffer: bytes) -> None:
        """Refuse a head that cannot become good, without waiting for its end."""
        line_end = buffer.find(_CRLF)
        if line_end < 0:
            if len(buffer) > MAX_LINE:
                self._refuse(414, "the request line is too long")
            elif b"\n" in buffer:
                self._refuse(400, "a line of the request head ends in a bare LF, not CRLF")
            return
        self._line_path(buffer[:line_end])
        if buffer.count(b"\n") != buffer.count(_CRLF):
            self._refuse(400, "a line of the request head ends in a bare LF, not CRLF")
        elif len(buffer) - line_end - 2 > MAX_HEADER_BYTES + 2:
            self._refuse(431, "a request header line is too long, or there are too many")

    def _line_path(self, line: bytes) -> None:
        parts = line.split(b" ")
        if len(parts) == 3:
            self.path = origin_form(parts[1])[0]

    def _read_head(self, head: bytes) -> None:
        line_end = head.find(_CRLF)
        self._line_path(head[:line_end])
        if line_end > MAX_LINE:
            self._refuse(414, "the request line is too long")
            return
        if head.count(b"\n") != head.count(_CRLF):
            self._refuse(400, "a line of the request head ends in a bare LF, not CRLF")
            return
        if b"\r\n " in head or b"\r\n\t" in head:
            self._refuse(400, "a header line is folded onto the one before (obs-fold)")
            return
        if len(head) - line_end - 4 > MAX_HEADER_BYTES:
            self._refuse(431, "the request has too many headers, or too many header bytes")
            return
        parsed = _Head()
        parser = httptools.HttpRequestParser(parsed)
        try:
            parser.feed_data(head)
        except httptools.HttpParserUpgrade:
            pass  # an Upgrade header: crossbar upgrades nothing, the request is plain HTTP
        except httptools.HttpParserError as e:
            self._refuse(400, not_http(e, parsed.headers))
            return
        headers = parsed.headers
        if len(headers) > MAX_HEADERS:
            self._refuse(431, "the request has too many headers, or too many header bytes")
            return
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            self._refuse(400, f"HTTP/{version} is not served: send HTTP/1.1")
            return
        self._version = b"HTTP/1.1" if version == "1.1" else b"HTTP/1.0"
        why, length, chunked, tokens = framing(headers, self._version)
        if why is not None:
            self._refuse(400, why)
            return
        self._command = parser.get_method()
        self.path, authority = origin_form(parsed.url)
        if authority is not None:
            # RFC 9112, 3.2.2: a target in absolute form names the host; its Host header is
            # ignored, so what reads Host (the admin API's Klein) reads the target's.
            headers = [
                (name, authority if name.lower() == b"host" else value) for name, value in headers
            ]
        self._persistent = self._version == b"HTTP/1.1" and b"close" not in tokens
        self._start(headers, length, chunked)

    def _start(self, headers: list[tuple[bytes, bytes]], length: int, chunked: bool) -> None:
        """A head is in: make its request and begin its body."""
        self._turn_left -= 1
        request = self.requestFactory(self)
        request.headers_received(headers)
        self.requests.append(request)
        if not self._persistent and self._version == b"HTTP/1.1":
            request.responseHeaders.setRawHeaders(b"Connection", [b"close"])
        request.gotLength(None if chunked else length)
        if self._refused:  # the request refused its length (413, 503)
            return
        expect = request.requestHeaders.getRawHeaders(b"expect")
        if expect and expect[0].lower() == b"100-continue" and self._version == b"HTTP/1.1":
            if chunked or length:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[union-attr]
        if chunked:
            self._phase = "body"
            self._chunks = StrictChunks(
                self._chunk_data,
                self._chunked_end,
                getattr(request, "chunk_declared", None) or (lambda n: True),
                lambda why: self._refuse(400, why),
            )
        elif length:
            self._phase = "body"
            self._left = length
        else:
            self._received()

    # -- the body

    def _body(self, data: bytes) -> bytes:
        """Take body bytes; returns what follows the body once it ended (b"" until then)."""
        chunks = self._chunks
        if chunks is not None:
            self._rest = b""
            chunks.dataReceived(data)
            rest, self._rest = self._rest, b""
        else:
            request = self.requests[-1]
            if len(data) < self._left:
                self._left -= len(data)
                request.handleContentChunk(data)
                rest = b""
            else:
                piece, rest = data[: self._left], data[self._left :]
                self._left = 0
                request.handleContentChunk(piece)
                if not self._refused:
                    self._received()
                return rest
        return rest

    def _chunk_data(self, piece: bytes) -> bool:
        """A piece of chunk data for the request; False when that refused it (stop reading)."""
        self.requests[-1].handleContentChunk(piece)
        return not self._refused

    def _chunked_end(self, rest: bytes) -> None:
        self._chunks = None
        self._rest = rest
        if not self._refused:
            self._received()

    def _body_pending(self) -> None:
        """More of a body is due (its head is in, or some of its bytes): the pause timer runs
        from now, and the whole body's deadline from the first time this is said."""
        site = self.site
        self._body_mark = site.reactor.seconds()
        if self._timer is None:
            # One timer for the body's pauses, moved on lazily when it fires (none is made or
            # cancelled per read: a body of many small reads costs no timer each).
            self._timer = self._later(site.body_timeout, self._body_paused)
        if self._deadline is None:
            self._deadline = self._later(
                site.body_deadline,
                self._refuse,
                408,
                "the request's body did not all arrive within "
                f"{format_duration(site.body_deadline)} of its headers",
            )

    def _body_paused(self) -> None:
        self._timer = None
        left = self._body_mark + self.site.body_timeout - self.site.reactor.seconds()
        if left > 0:
            self._timer = self._later(left, self._body_paused)
            return
        self._refuse(408, "the request's body stopped arriving")

    def _received(self) -> None:
        """The request is all in: it is handled, and bytes after it wait their turn."""
        self._phase = "handling"
        if self._timer is not None or self._deadline is not None:
            self._disarm()
        request = self.requests[-1]
        request.requestReceived(self._command, self.path, self._version)

    # -- what a request calls (twisted.web's HTTPChannel interface)

    def requestDone(self, request: Any) -> None:
        """`request` is answered: read the next one, or close."""
        if self.requests and self.requests[0] is request:
            del self.requests[0]
        if not self._persistent:
            self.loseConnection()
            return
        self._phase = "idle"
        self._mark_idle()
        if self._taking or self._next_turn is not None or self._waiting_for_transport:
            return  # the loop that answered it, the next turn, or resumeProducing reads on
        self._turn_left = TURN_REQUESTS  # answered later than it came: a turn of its own
        self._read_pipelined()

    def _turn(self) -> None:
        """This connection's next turn: read on into its pipeline."""
        self._next_turn = None
        self._turn_left = TURN_REQUESTS
        if self._phase == "idle" and not self._refused and self.transport is not None:
            self._read_pipelined()

    def _read_pipelined(self) -> None:
        """Read the bytes that came while a request was handled; reading resumes once fewer
        than `_EAGER` of them wait."""
        if self._ahead:
            data = b"".join(self._ahead)
            self._ahead, self._ahead_size = [], 0
            self._take(data)
        if (
            self._paused
            and self._ahead_size <= _EAGER
            and not self._waiting_for_transport
            and not self._refused
        ):
            self._paused = False
            self.transport.resumeProducing()  # type: ignore[union-attr]

    def writeHeaders(
        self, version: bytes, code: bytes, reason: bytes, headers: Any, then: Sequence[bytes] = ()
    ) -> None:
        """Write the status line and `headers` (twisted.web's Request calls this), and the
        first of the body (`then`) in the same write."""
        every = getattr(headers, "getAllRawHeaders", None)
        pairs = every() if every is not None else _grouped(headers)
        lines = [version, b" ", code, b" ", reason, _CRLF]
        for name, values in pairs:
            for value in values:
                lines += (name, b": ", value, _CRLF)
        lines.append(_CRLF)
        write_now(self.transport, [b"".join(lines), *then])

    def write(self, data: bytes) -> None:
        write_now(self.transport, (data,))

    def writeSequence(self, data: Sequence[bytes]) -> None:
        write_now(self.transport, data)

    def getPeer(self) -> Any:
        return self._peer

    def getHost(self) -> Any:
        return self.transport.getHost()  # type: ignore[union-attr]

    def isSecure(self) -> bool:
        return self._secure

    def loseConnection(self) -> None:
        self.transport.unregisterProducer()  # type: ignore[union-attr]
        self.transport.loseConnection()  # type: ignore[union-attr]

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        """The answer's producer: paused and resumed with the client's connection."""
        if self._request_producer is not None:
            raise RuntimeError(f"a producer ({self._request_producer}) is registered already")
        if not streaming:
            producer = pull_to_push(producer, self)
        self._request_producer = producer
        if self._waiting_for_transport:
            producer.pauseProducing()

    def unregisterProducer(self) -> None:
        producer, self._request_producer = self._request_producer, None
        stop = getattr(producer, "stopStreaming", None)
        if stop is not None:
            stop()

    # IPushProducer, for the transport: its buffer is full, or has room again.

    def pauseProducing(self) -> None:
        self._waiting_for_transport = True
        if self._request_producer is not None:
            self._request_producer.pauseProducing()
        if self._phase != "handling" and not self._paused:
            self._paused = True  # answers wait to be read: read no more requests meanwhile
            self.transport.pauseProducing()  # type: ignore[union-attr]

    def resumeProducing(self) -> None:
        self._waiting_for_transport = False
        if self._request_producer is not None:
            self._request_producer.resumeProducing()
        if self._phase != "handling" and self._paused:
            self._paused = False
            self.transport.resumeProducing()  # type: ignore[union-attr]
        if self._phase == "idle" and self._ahead and self._next_turn is None:
            # Pipelined requests waited for their answers to be read: on with them, in a turn
            # of their own (not inside the transport's call).
            self._next_turn = self._later(0, self._turn)

    def stopProducing(self) -> None:
        if self._request_producer is not None:
            self._request_producer.stopProducing()

    def _respondToBadRequestAndDisconnect(self) -> None:
        # twisted.web's Request calls this for a form body it cannot parse.
        self._refuse(400, "the request body is not a form that can be read")

    # -- timers

    def _later(self, seconds: float, f: Callable[..., Any], *args: Any) -> IDelayedCall:
        later = self.callLater
        if later is None:
            from twisted.internet import reactor

            later = reactor.callLater  # type: ignore[attr-defined]
        return later(seconds, f, *args)

    def _arm(self, seconds: float, why: str) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = self._later(seconds, self._refuse, 408, why)

    def _disarm(self) -> None:
        """Cancel the head's or the body's timers."""
        for timer in (self._timer, self._deadline):
            if timer is not None and timer.active():
                timer.cancel()
        self._timer = self._deadline = None

    def _mark_idle(self) -> None:
        """The connection waits for a request: after the site's idle timeout without one, it
        closes. One timer per connection, moved on lazily (none is made per request)."""
        if not self.timeOut or self.site is None:
            return
        self._last = self.site.reactor.seconds()
        if self._idle is None or not self._idle.active():
            self._idle = self._later(self.timeOut, self._idle_check)

    def _idle_check(self) -> None:
        self._idle = None
        if self._phase not in ("idle",) or self.transport is None:
            if self._phase != "idle":  # a request is arriving or answered: idle after it
                self._idle = self._later(self.timeOut, self._idle_check)  # type: ignore[arg-type]
            return
        left = self._last + self.timeOut - self.site.reactor.seconds()  # type: ignore[operator]
        if left > 0:
            self._idle = self._later(left, self._idle_check)
            return
        self.loseConnection()

    # -- refusals

    def _refuse(self, status: int, message: str) -> None:
        """Answer `status` (`invalid_request_error`) as `refuse` does."""
        self.refuse(ClientError(status, "invalid_request_error", message), message)

    def refuse(self, error: ClientError, why: str, request: Any = None) -> None:
        """Answer `error` with its JSON body on the raw connection, in the shape the request's
        path asks for, and close it: nothing more is read. `request`, once its headers are
        in, lends its route's CORS headers."""
        if self._refused or self.transport is None:
            return
        self._refused = True
        self._disarm()
        refusal = self.site.refusal(self, request)
        body = error.body(refusal.shape)
        headers = [*refusal.headers, *((k.encode(), v.encode()) for k, v in error.headers.items())]
        self.transport.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nConnection: close\r\n"
            % (error.status, phrase(error.status))
            + b"".join(b"%s: %s\r\n" % pair for pair in headers)
            + b"Content-Length: %d\r\n\r\n" % len(body)
            + body
        )
        self.loseConnection()
        self.site.refused(refusal, error.status, why)


def _grouped(pairs: Sequence[Any]) -> list[tuple[bytes, list[bytes]]]:
    return [(name, [value]) for name, value in pairs]
