"""A request crossbar makes of itself (a batch's item, crossbar.batches): it runs through the
proxy's whole sequence as a client's would (route, key, class, lease, guard, charge, slot,
upstream, relay, usage), with its key already known by name instead of by a secret, and its
answer kept in memory instead of written to a socket.

Only crossbar's own code makes one: nothing a client sends can become one, so the key it
names is never a claim to check against a secret. The key is still looked up when the request
runs, so a key blocked or deleted since its batch began is refused as a client's would be.
"""

from __future__ import annotations

import io
from typing import Any

from attrs import frozen
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ConnectionDone
from twisted.web.http import RESPONSES

from crossbar.wire import RawHeaders


@frozen
class InsideAnswer:
    """What the proxy answered: status, headers, the whole body; `cut` when the body ended
    before its end (a stream cut, a connection crossbar closed)."""

    status: int
    headers: RawHeaders
    body: bytes
    cut: bool = False


class _Peer:
    type = "INSIDE"
    host = "crossbar"
    port = 0


class _Transport:
    """The end of an inside request's "connection": closing it ends the answer as cut."""

    def __init__(self, request: InsideRequest) -> None:
        self._request = request

    def loseConnection(self) -> None:
        self._request.cut()

    abortConnection = loseConnection

    def getPeer(self) -> _Peer:
        return _Peer()


class _Channel:
    """What the relay and the error writer use of a channel: its transport, producers."""

    def __init__(self, request: InsideRequest) -> None:
        self.transport = _Transport(request)

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        pass  # memory takes every byte at once: nothing to pause

    def unregisterProducer(self) -> None:
        pass

    def isSecure(self) -> bool:
        return False


class InsideRequest:
    """One request crossbar sends itself; `answered` fires with its `InsideAnswer`."""

    clientproto = b"HTTP/1.1"
    code = 200
    code_message = b"OK"
    startedWriting = False
    finished = False

    def __init__(
        self, method: bytes, path: bytes, headers: list[tuple[bytes, bytes]], body: bytes,
        key: str | None,
    ) -> None:  # fmt: skip
        """`path`: the whole path, `/r/<route>/...`; `key`: the named key it runs as (None:
        no key)."""
        self.method = method
        self.uri = self.path = path
        self.requestHeaders = RawHeaders(headers)
        self.responseHeaders = RawHeaders()
        self.body = body
        self.key = key
        self.channel: _Channel | None = _Channel(self)
        self.answered: Deferred[InsideAnswer] = Deferred()
        self._parts: list[bytes] = []
        self._finished: list[Deferred[None]] = []

    @property
    def content(self) -> io.BytesIO:
        return io.BytesIO(self.body)

    def getHeader(self, name: bytes | str) -> Any:
        values = self.requestHeaders.getRawHeaders(name)
        return values[-1] if values else None

    def getClientAddress(self) -> _Peer:
        return _Peer()

    def isSecure(self) -> bool:
        return False

    def notifyFinish(self) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        self._finished.append(d)
        return d

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        self.code = code
        self.code_message = message or RESPONSES.get(code, b"Unknown Status")

    def setHeader(self, name: bytes | str, value: bytes | str) -> None:
        self.responseHeaders.setRawHeaders(name, [value])

    def write(self, data: bytes) -> None:
        if self.finished:
            raise RuntimeError("Request.write called on a request after Request.finish was called.")
        self.startedWriting = True
        if data:
            self._parts.append(data)

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        pass

    def unregisterProducer(self) -> None:
        pass

    def finish(self) -> None:
        self._end(cut=False)

    def cut(self) -> None:
        """The answer ended before its end: what came is kept, marked cut."""
        self._end(cut=True)

    def _end(self, cut: bool) -> None:
        if self.finished or self.channel is None:
            return
        self.finished = True
        self.channel = None
        answer = InsideAnswer(self.code, self.responseHeaders, b"".join(self._parts), cut)
        self._parts = []
        waiting, self._finished = self._finished, []
        for d in waiting:
            d.callback(None)  # a cut is the proxy's own ending, not a client that left
        self.answered.callback(answer)

    def abort(self) -> None:
        """Stop it as a client that went away would (its host request aborted, its slot
        freed); `answered` fails with CancelledError."""
        if self.finished:
            return
        self.finished = True
        self.channel = None
        waiting, self._finished = self._finished, []
        for d in waiting:
            d.errback(ConnectionDone("inside request aborted"))
        if not self.answered.called:
            self.answered.errback(CancelledError())
