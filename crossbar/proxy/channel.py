"""The HTTP connections of crossbar's sites (the proxy's and the admin API's): deadlines for
slow clients, and JSON answers where Twisted would drop the connection or answer a bare 400.

- The request line and headers must all arrive within `header_timeout` of their first byte,
  a body must not pause longer than `body_timeout` between bytes, and must all arrive within
  `body_deadline` of its first byte: else 408 and close (`Site(timeout=)` is an idle timer
  reset by every byte, which a client trickling one byte every few seconds never trips).
- Small writes go out at once (TCP_NODELAY, as nginx does): an answer's head and body are
  separate writes, and Nagle would hold the second until the client's delayed ACK.
- A request line or header line longer than Twisted's line limit: 414 or 431; more headers or
  header bytes than Twisted allows: 431; any other request Twisted cannot parse: 400. Each
  with crossbar's JSON error body, then the connection closes.
- Framings that two parsers could read two ways (the raw material of request smuggling), which
  Twisted takes or waits on, are 400 too: a `Transfer-Encoding` other than one `chunked`, or
  on an HTTP/1.0 request; a folded header line (obs-fold); a line of the head that ends in a
  bare LF; and what proxy/chunks.py refuses in a chunked body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IDelayedCall
from twisted.web.http import HTTPChannel

from crossbar.config import format_duration
from crossbar.proxy.chunks import StrictChunks
from crossbar.wire import ClientError, head_too_large, no_delay, phrase, replace_chunked_decoder


class ProxyChannel(HTTPChannel):
    """One client connection of a crossbar site (the site holds the timeouts)."""

    _phase = "idle"  # idle, head, body, handling
    _timer: IDelayedCall | None = None  # the head's deadline, or the body's pause
    _deadline: IDelayedCall | None = None  # the whole body's
    _head_lines = 0
    _heads = 0  # request heads begun on this connection
    _request_line = b""  # of the head arriving now
    _unended = b""  # the head's bytes after its last CRLF
    _transfer_encoded = False  # the head arriving now has a Transfer-Encoding header
    _refused = False

    def connectionMade(self) -> None:
        no_delay(self.transport)
        super().connectionMade()

    def dataReceived(self, data: bytes) -> None:
        if self._phase == "idle" and data:
            self._phase = "head"
            self._heads += 1
            self._head_lines = 0
            self._request_line = self._unended = b""
            self._transfer_encoded = False
            self._arm(self.site.header_timeout, "the request's headers did not arrive in time")
        head = self._heads if self._phase == "head" else None
        super().dataReceived(data)
        if self._phase == "head" and self._heads == head and not self._refused:
            # Lines end at CRLF: a head whose lines end in a bare LF would wait for one until
            # header_timeout. The head that took these bytes goes on: all went to its lines.
            # (A head begun beneath this call, pipelined behind a request answered at once,
            # took only the bytes after that request's body, and was checked there.)
            self._unended = (self._unended + data).rsplit(b"\r\n", 1)[-1]
            if b"\n" in self._unended:
                self._refuse(400, "a line of the request head ends in a bare LF, not CRLF")

    def lineReceived(self, line: bytes) -> None:
        self._head_lines += 1
        if b"\n" in line:
            self._refuse(400, "a line of the request head ends in a bare LF, not CRLF")
            return
        if not self._request_line:
            self._request_line = line  # (Twisted skips one empty line before it)
        elif line[:1] in (b" ", b"\t"):
            self._refuse(400, "a header line is folded onto the one before (obs-fold)")
            return
        super().lineReceived(line)

    def headerReceived(self, line: bytes) -> bool:
        name, _, value = line.partition(b":")
        if name.lower() == b"transfer-encoding":
            why = self._transfer_encoding(value.strip(b" \t"))
            if why is not None:
                self._refuse(400, why)
                return False
        return super().headerReceived(line)

    def _transfer_encoding(self, value: bytes) -> str | None:
        """Why a Transfer-Encoding header cannot be taken, or None. Twisted takes `identity`
        beside a Content-Length, a second header after `chunked`, and chunked on HTTP/1.0,
        where another parser reads the body's length another way."""
        if self._transfer_encoded:
            return "the request has more than one Transfer-Encoding header"
        self._transfer_encoded = True
        version = self._request_line.rsplit(b" ", 1)[-1]
        if version != b"HTTP/1.1":
            shown = version.decode("latin-1")[:20]
            return f"Transfer-Encoding on an {shown} request: a chunked body needs HTTP/1.1"
        if value.lower() != b"chunked":
            shown = value.decode("latin-1")[:40]
            return f"Transfer-Encoding {shown!r}: crossbar takes only chunked"
        return None

    def allHeadersReceived(self) -> None:
        self._phase = "body"
        self._arm(self.site.body_timeout, "the request's body stopped arriving")
        replace_chunked_decoder(self, self._strict_chunks)
        super().allHeadersReceived()

    def _strict_chunks(
        self, data: Callable[[bytes], None], finish: Callable[[bytes], None]
    ) -> StrictChunks:
        # Each chunk's size goes to the request before its data: 413 or 503 before the bytes.
        declared = getattr(self.requests[-1], "chunk_declared", None) or (lambda length: True)
        return StrictChunks(data, finish, declared, lambda why: self._refuse(400, why))

    def rawDataReceived(self, data: bytes) -> None:
        super().rawDataReceived(data)
        # Armed only for a body still arriving once these bytes are taken: most bodies come
        # whole with their head, and two timers made and cancelled per request cost.
        if self._phase == "body" and not self._refused:
            self._arm(self.site.body_timeout, "the request's body stopped arriving")
            if self._deadline is None:
                self._deadline = self.callLater(
                    self.site.body_deadline,
                    self._refuse,
                    408,
                    "the request's body did not all arrive within "
                    f"{format_duration(self.site.body_deadline)} of its first byte",
                )

    def allContentReceived(self) -> None:
        self._phase = "handling"
        self._disarm()
        super().allContentReceived()

    def requestDone(self, request: Any) -> None:
        self._phase = "idle"
        super().requestDone(request)

    def connectionLost(self, reason: Any) -> None:
        self._disarm()
        super().connectionLost(reason)

    def _send100Continue(self) -> None:
        # Twisted asks for the body after the request judged its length: a body refused then
        # (413, 503) must not be asked for, and a TCP transport sends what is written after
        # loseConnection, so the refusal's answer would be followed by "100 Continue".
        if not self._refused:
            super()._send100Continue()

    def lineLengthExceeded(self, line: bytes) -> None:
        if self._head_lines == 0:
            self._refuse(414, "the request line is too long")
        else:
            self._refuse(431, "a request header line is too long")

    def _respondToBadRequestAndDisconnect(self) -> None:
        # Twisted's bare "400 Bad Request" for anything it cannot parse, with our body instead.
        if head_too_large(self):
            self._refuse(431, "the request has too many headers, or too many header bytes")
        else:
            self._refuse(400, "the request is not valid HTTP/1.1")

    def _arm(self, seconds: float, why: str) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = self.callLater(seconds, self._refuse, 408, why)

    def _disarm(self) -> None:
        """Cancel every timer: the head's or the body's pause, and the body's deadline."""
        for timer in (self._timer, self._deadline):
            if timer is not None and timer.active():
                timer.cancel()
        self._timer = self._deadline = None

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
        self.dataReceived = lambda data: None  # type: ignore[method-assign]
        self.site.refused(refusal, error.status, why)
