"""A client request on the proxy port, and the bound on request bodies both ports share.

`ProxyRequest` is what the proxy's Resource and the relay use of twisted.web's Request, and
no more: the method, target and headers (`RawHeaders`, as llhttp read them), the body, the
client's address, the answer's status and headers, `write` (chunked where HTTP/1.1 needs it),
`finish`, `notifyFinish`, producers. twisted.web's Request also parses the query into
`args`, cookies, the Host, a session, looks the resource up through the tree and formats a
Date for every answer; the proxy's one leaf resource needs none of that, and it was a tenth
of the proxy's CPU. The admin port keeps twisted.web's Request (Klein needs it), bounded the
same way (proxy/site.py `BoundedRequest`).

Request bodies are held as `crossbar.proxy.held` says.
"""

from __future__ import annotations

import io
from email.utils import formatdate
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http import NO_BODY_CODES, RESPONSES
from twisted.web.server import NOT_DONE_YET

from crossbar.proxy.held import HeldBody, HoldsBody
from crossbar.wire import INTERNAL, RawHeaders, write_error

log = Logger(namespace="crossbar.proxy")

_CRLF = b"\r\n"


class _Dates:
    """The Date header's value, formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def at(self, seconds: float) -> bytes:
        second = int(seconds)
        if second != self._second:
            self._second = second
            self._value = formatdate(second, usegmt=True).encode("ascii")
        return self._value


_DATES = _Dates()


class ProxyRequest(HoldsBody):
    """One request on the proxy port, as the proxy's Resource and relay use it."""

    method = b""
    uri = b""
    path = b""
    clientproto = b"HTTP/1.1"
    code = 200
    code_message = b"OK"
    startedWriting = False
    finished = False
    chunked = False
    producer: Any = None
    _refused = False
    _disconnected = False
    _no_body = False

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self._client = channel.getPeer()  # kept: asked for after the answer too (its log)
        self.requestHeaders = RawHeaders()
        self.responseHeaders = RawHeaders()
        self._body = HeldBody()
        self._finished: list[Deferred[None]] = []

    # -- what the channel calls

    def headers_received(self, pairs: list[tuple[bytes, bytes]]) -> None:
        self.requestHeaders = RawHeaders(pairs)

    def gotLength(self, length: int | None) -> None:
        if length is not None:
            self._declare(length)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if self._refused:
            return
        self.method, self.uri, self.clientproto = command, path, version
        cut = path.find(b"?")
        self.path = path if cut < 0 else path[:cut]
        try:
            result = self.channel.site.resource.render(self)
        except Exception:
            log.failure("request failed inside crossbar", Failure())
            write_error(self, INTERNAL)
            return
        if result is not NOT_DONE_YET:  # bytes: the whole answer
            self.write(result)
            self.finish()

    def connectionLost(self, reason: Failure) -> None:
        self._disconnected = True
        self.channel = None
        self._body.release()
        waiting, self._finished = self._finished, []
        for d in waiting:
            d.errback(reason)

    # -- what the resource reads

    @property
    def content(self) -> io.BytesIO:
        """The body as a file (twisted.web's name); `body` is the bytes themselves."""
        return io.BytesIO(self.body)

    @property
    def body(self) -> bytes:
        return self._body.content()

    def getHeader(self, name: bytes | str) -> Any:
        values = self.requestHeaders.getRawHeaders(name)
        return values[-1] if values else None

    def getClientAddress(self) -> Any:
        return self._client

    def isSecure(self) -> bool:
        return self.channel is not None and self.channel.isSecure()

    def notifyFinish(self) -> Deferred[None]:
        """Fires when the answer is all written, or fails when the client went first."""
        d: Deferred[None] = Deferred()
        self._finished.append(d)
        return d

    # -- the answer

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        self.code = code
        self.code_message = message or RESPONSES.get(code, b"Unknown Status")

    def setHeader(self, name: bytes | str, value: bytes | str) -> None:
        self.responseHeaders.setRawHeaders(name, [value])

    def write(self, data: bytes) -> None:
        if self.finished:
            raise RuntimeError("Request.write called on a request after Request.finish was called.")
        if self._disconnected:
            return
        if not self.startedWriting:
            self._write_head(data)
        elif data and not self._no_body:
            if self.chunked:
                self.channel.writeSequence((b"%x\r\n" % len(data), data, _CRLF))
            else:
                self.channel.write(data)

    def _write_head(self, data: bytes) -> None:
        """The status line and headers, and `data` after them in the same write."""
        self.startedWriting = True
        headers = self.responseHeaders
        code = self.code
        self._no_body = self.method == b"HEAD" or code in NO_BODY_CODES
        if (
            self.clientproto == b"HTTP/1.1"
            and not self._no_body
            and not headers.hasHeader(b"content-length")
        ):
            headers.setRawHeaders(b"Transfer-Encoding", [b"chunked"])
            self.chunked = True
        if not headers.hasHeader(b"date"):
            headers.setRawHeaders(b"Date", [_DATES.at(self.channel.site.reactor.seconds())])
        then: tuple[bytes, ...] = ()
        if data and not self._no_body:
            then = (b"%x\r\n" % len(data), data, _CRLF) if self.chunked else (data,)
        self.channel.writeHeaders(self.clientproto, b"%d" % code, self.code_message, headers, then)

    def finish(self) -> None:
        if self._disconnected:
            raise RuntimeError(
                "Request.finish called on a request after its connection was lost; "
                "use Request.notifyFinish to keep track of this."
            )
        if self.finished:
            return
        if not self.startedWriting:
            self.write(b"")
        if self.chunked:
            self.channel.write(b"0\r\n\r\n")
        self.finished = True
        self._body.release()
        channel, self.channel = self.channel, None
        channel.requestDone(self)
        waiting, self._finished = self._finished, []
        for d in waiting:
            d.callback(None)

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        self.producer = producer
        self.channel.registerProducer(producer, streaming)

    def unregisterProducer(self) -> None:
        self.producer = None
        if self.channel is not None:
            self.channel.unregisterProducer()

    def loseConnection(self) -> None:
        if self.channel is not None:
            self.channel.loseConnection()
