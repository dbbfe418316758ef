"""The proxy's HTTP connections: deadlines for slow clients, and JSON answers where Twisted
would drop the connection or answer a bare 400.

- The request line and headers must all arrive within `header_timeout` of their first byte,
  a body must not pause longer than `body_timeout` between bytes, and must all arrive within
  `body_deadline` of its first byte: else 408 and close (`Site(timeout=)` is an idle timer
  reset by every byte, which a client trickling one byte every few seconds never trips).
- Small writes go out at once (TCP_NODELAY, as nginx does): an answer's head and body are
  separate writes, and Nagle would hold the second until the client's delayed ACK.
- A request line or header line longer than Twisted's line limit: 414 or 431; more headers or
  header bytes than Twisted allows: 431; any other request Twisted cannot parse: 400. Each
  with crossbar's JSON error body, then the connection closes.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import IDelayedCall
from twisted.web.http import HTTPChannel

from crossbar.config import format_duration
from crossbar.wire import ClientError, head_too_large, no_delay, phrase


class ProxyChannel(HTTPChannel):
    """One client connection of the proxy site (the site holds the timeouts)."""

    _phase = "idle"  # idle, head, body, handling
    _timer: IDelayedCall | None = None  # the head's deadline, or the body's pause
    _deadline: IDelayedCall | None = None  # the whole body's
    _head_lines = 0
    _refused = False

    def connectionMade(self) -> None:
        no_delay(self.transport)
        super().connectionMade()

    def dataReceived(self, data: bytes) -> None:
        if self._phase == "idle" and data:
            self._phase = "head"
            self._head_lines = 0
            self._arm(self.site.header_timeout, "the request's headers did not arrive in time")
        super().dataReceived(data)

    def lineReceived(self, line: bytes) -> None:
        self._head_lines += 1
        super().lineReceived(line)

    def allHeadersReceived(self) -> None:
        self._phase = "body"
        self._arm(self.site.body_timeout, "the request's body stopped arriving")
        super().allHeadersReceived()

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
        """Answer `status` with a JSON error on the raw connection and close it."""
        if self._refused or self.transport is None:
            return
        self._refused = True
        self._disarm()
        refusal = self.site.refusal(self)
        body = ClientError(status, "invalid_request_error", message).body(refusal.shape)
        self.transport.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n" % (status, phrase(status), len(body)) + body
        )
        self.loseConnection()
        self.dataReceived = lambda data: None  # type: ignore[method-assign]
        self.site.refused(refusal, status, message)
