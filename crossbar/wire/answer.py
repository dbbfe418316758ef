"""A host's answer as llhttp (Node.js's parser, through httptools) reads it: its head, its body as
it comes, how it ended; what the pool's connections (pool.py) hand their callers.

What the answer says goes to the caller as a `HostResponse`, which reads like twisted.web's
IResponse (code, phrase, headers, length, deliverBody) so the relay stays what it was. How an
answer can fail, each its own exception: the connection closed before the answer's head had all
come (`HostClosed`), or the bytes were not HTTP (`NotHTTP`: a bad status line or header, more
than 100 headers or 64 KiB of head, a bad length, a Transfer-Encoding other than one
`chunked`). A body cut short ends its protocol with
`ResponseFailed`; one read to the close (no length, not chunked) with `PotentialDataLoss`; a
whole one with `ResponseDone`, as twisted.web's client does.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import httptools
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol as TwistedProtocol
from twisted.internet.protocol import connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import UNKNOWN_LENGTH
from zope.interface import implementer

from crossbar.wire.headers import RawHeaders

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
log = Logger(namespace="crossbar.upstream")


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


class Carrier(Protocol):
    """The connection an answer comes on (pool.py `HostConnection`), as the answer knows it."""

    reading: Reading | None  # the answer it reads now

    def answered(self, reading: Reading, response: HostResponse) -> None: ...

    def ended(self, reading: Reading, keep: bool) -> None: ...

    def fail(self, reading: Reading, error: Exception) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def stop(self) -> None: ...


@implementer(IPushProducer)
class _BodyTransport:
    """What a body's protocol holds as its transport: pause, resume or stop the host's
    connection under it, while its answer is still being read (once it has all been read, the
    connection may carry the next request already: it is no longer this body's)."""

    def __init__(self, connection: Carrier, response: HostResponse) -> None:
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
        connection: Carrier,
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


class Reading:
    """llhttp's callbacks for one answer: its status line and headers as they come, then its
    body to the connection's current response. A reader whose answer ended (and whose
    connection may carry the next request already) takes nothing more.

    What one read brings (the head, body pieces, the end) is `held`, and passed on by the
    connection once the read is parsed (`pass_on`): an answer that ends in it calls `on_done`
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
        connection: Carrier,
        head_only: bool,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self.connection = connection
        self.head_only = head_only
        self.on_done = on_done
        self.held: list[Callable[[], None]] = []
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
                    if self.chunked or value.strip(b" \t").lower() != b"chunked":
                        # gzip and the like would reach the client undecoded and unframed.
                        shown = value.decode("latin-1")[:40]
                        self.failure = NotHTTP(
                            f"Transfer-Encoding {shown!r}: crossbar reads only chunked"
                        )
                        raise self.failure
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
            self.held.append(partial(self._relay_body, self.response, body))

    def pass_on(self) -> None:
        """What the read just parsed brought, in order (a reader's fault drops the rest)."""
        held = self.held
        for passed_on in held:
            passed_on()
        held.clear()

    def unreadable(self, error: Exception) -> str:
        """What llhttp could not read, in the words of where it stopped."""
        if not self.status and not self.headers:
            return f"bad status line or status code ({error})"
        return f"bad response head ({error})"

    def _relay_body(self, response: HostResponse, body: bytes) -> None:
        """A held piece of the body, passed on after its read was parsed. A fault in whoever
        reads it is crossbar's, not the host's: logged, and the answer ends with it (and the
        connection, unless it was all read and may carry the next request already)."""
        try:
            response.data(body)
        except Exception:
            log.failure("reading a host's answer failed inside crossbar")
            self.held.clear()
            if self is self.connection.reading:
                self.connection.fail(self, ReaderFault())
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


class _Collect(TwistedProtocol):
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


class _Still:
    """The transport of an answer already read: nothing to pause, resume or stop."""

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


class ReadAnswer:
    """A host's answer whose body was read whole (to see what it says), to be relayed all the
    same: its status and headers as they came, its body delivered again."""

    def __init__(self, response: HostResponse, body: bytes) -> None:
        self.version = response.version
        self.code = response.code
        self.phrase = response.phrase
        self.headers = response.headers
        self.connection_headers = response.connection_headers
        self.length = len(body)
        self.read_whole = True
        self._body = body

    def deliverBody(self, protocol: Any) -> None:
        protocol.makeConnection(_Still())
        if self._body:
            protocol.dataReceived(self._body)
        protocol.connectionLost(Failure(ResponseDone()))
