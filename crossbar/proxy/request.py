"""A client request on the proxy port, and the bound on request bodies both ports share.

`ProxyRequest` is what the proxy's Resource and the relay use of twisted.web's Request, and
no more: the method, target and headers (`RawHeaders`, as llhttp read them), the body, the
client's address, the answer's status and headers, `write` (chunked where HTTP/1.1 needs it),
`finish`, `notifyFinish`, producers. twisted.web's Request also parses the query into
`args`, cookies, the Host, a session, looks the resource up through the tree and formats a
Date for every answer; the proxy's one leaf resource needs none of that, and it was a tenth
of the proxy's CPU. The admin port keeps twisted.web's Request (Klein needs it), bounded the
same way (proxy/site.py `BoundedRequest`).

A body takes its bytes from the sites' `BodyMemory` as they arrive, into one buffer (never an
object per read or chunk), and gives them back and drops them when its request ends
(answered, refused, its client gone). A declared length (its Content-Length once the headers
are in, each chunk's size before its data) past `max_body` is 413, and past what the memory
has left 503, both before its bytes are read; bytes that arrive past what is left are 503 as
they do. A body declared and never sent holds nothing (the channel's `body_timeout` closes
it).
"""

from __future__ import annotations

import io
from email.utils import formatdate
from typing import Any

from attrs import define
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http import NO_BODY_CODES, RESPONSES
from twisted.web.server import NOT_DONE_YET

from crossbar.config import format_size
from crossbar.wire import INTERNAL, ClientError, RawHeaders, unavailable, write_error

log = Logger(namespace="crossbar.proxy")

# A body refused for memory asks to come back after this: bodies are given back as their
# requests end, and an answer takes seconds.
_MEMORY_RETRY_AFTER = 5.0
_CRLF = b"\r\n"


@define
class BodyMemory:
    """Bytes of request bodies held at once, over every connection of the sites sharing it."""

    limit: int
    held: int = 0

    def take(self, n: int) -> bool:
        """Hold `n` more bytes if they fit under the limit; False (nothing taken) if not."""
        if n and self.held + n > self.limit:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n


def too_large(limit: int) -> ClientError:
    return ClientError(
        413,
        "invalid_request_error",
        f"request body is larger than this server's limit of {format_size(limit)}",
    )


def no_memory(limit: int) -> ClientError:
    return unavailable(
        f"this server holds as many request bodies as it may at once ({format_size(limit)}, "
        "server.max_body_memory); try again shortly",
        retry_after=_MEMORY_RETRY_AFTER,
    )


class HeldBody:
    """One request's body as it arrives, within its site's `max_body` and `memory`.

    The bytes are kept in one buffer that grows with them (a read's bytes as they are when the
    body came in one read), never an object per read or per chunk: a body of 1-byte chunks
    costs its bytes, not an object and a list slot for each. Each byte is taken from `memory`
    as it arrives, so a body declared and never sent holds nothing."""

    __slots__ = ("_buffer", "_held", "_memory", "declared")

    def __init__(self) -> None:
        self._buffer: bytes | bytearray = b""
        self.declared = 0  # declared so far: the Content-Length, or the chunk sizes
        self._held = 0  # taken from `_memory`, given back by `release`
        self._memory: BodyMemory | None = None

    def declare(
        self, length: int, max_body: int, memory: BodyMemory
    ) -> tuple[ClientError, str] | None:
        """`length` more bytes are declared: the error and why when they cannot be taken (over
        `max_body`, or more than `memory` has left now). Nothing is taken until they arrive."""
        if self.declared + length > max_body:
            return too_large(max_body), "request body too large"
        if length > memory.limit - memory.held:
            return no_memory(memory.limit), "request bodies over max_body_memory"
        self.declared += length
        return None

    def add(self, data: bytes, memory: BodyMemory) -> tuple[ClientError, str] | None:
        """Keep `data`, taking its bytes from `memory`; the error and why when they do not fit
        (nothing kept)."""
        if not memory.take(len(data)):
            return no_memory(memory.limit), "request bodies over max_body_memory"
        self._memory = memory
        self._held += len(data)
        buffer = self._buffer
        if not buffer:
            self._buffer = data  # the whole body in one read: kept as it came, no copy
        elif isinstance(buffer, bytearray):
            buffer += data
        else:
            grown = bytearray(buffer)
            grown += data
            self._buffer = grown
        return None

    def content(self) -> bytes:
        """The body so far, in one piece: a grown buffer becomes bytes once, and the buffer
        goes (the body is never held twice for longer than the copy)."""
        buffer = self._buffer
        if isinstance(buffer, bytearray):
            buffer = self._buffer = bytes(buffer)
        return buffer

    def release(self) -> None:
        """Give the bytes back to `memory` and drop them: the request has ended."""
        self._buffer = b""
        if self._memory is not None and self._held:
            self._memory.give(self._held)
            self._held = 0


class HoldsBody:
    """What the channel calls as a body arrives, for both ports' requests: each declared
    length checked against `max_body` and the sites' `BodyMemory`, each byte taken from that
    memory as it arrives and kept in a `HeldBody`, and a body over a bound refused at once on
    the raw connection."""

    _body: HeldBody
    _refused = False
    channel: Any

    def chunk_declared(self, length: int) -> bool:
        """The next chunk of the body has `length` bytes; False when that refused the body."""
        return self._declare(length)

    def _declare(self, length: int) -> bool:
        site = self.channel.site
        refused = self._body.declare(length, site.max_body, site.memory)
        if refused is not None:
            self._refuse(*refused)
            return False
        return True

    def handleContentChunk(self, data: bytes) -> None:
        if not self._refused:
            refused = self._body.add(data, self.channel.site.memory)
            if refused is not None:
                self._refuse(*refused)

    def _refuse(self, error: ClientError, why: str) -> None:
        """Answer `error` at once on the raw connection and close it: the rest of the body is
        never read, and what it held is given back."""
        self._refused = True
        self._body.release()
        self.channel.refuse(error, why, self)


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
