"""A lean `Getter` for health probes: a bare HTTP/1.1 `GET .../health` on one kept connection
per host.

Through treq, the Agent and its pool a probe cost about 1.5 ms of CPU, and 200 hosts probed
every second are 200 probes a second. Here a probe is one write of a prebuilt request and a
small parse of the answer (status line, headers, a Content-Length or chunked body, or a body
up to the close). Anything unusual (an informational status, another transfer coding, a head
or body past its bound, a header that cannot be sent as is, an https URL, a second request to
a host while one is under way) goes to the `fallback` Getter (treq), which says what is wrong
the way every other request does. Other paths (`/props`, `/models`) go to the fallback too.

Cancelling a probe (its health_timeout) drops its connection; any error drops it too, and the
next probe connects afresh. A kept connection that turns out closed before any answer byte
came (the host closed it while idle) is tried once more on a new connection.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from twisted.internet.defer import Deferred, succeed
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import URI, ResponseFailed, ResponseNeverReceived

from crossbar.hosts.health import Getter
from crossbar.wire import HostEndpoints

MAX_HEAD = 64 * 1024  # as twisted_private.MAX_RESPONSE_HEAD_BYTES: past it, the fallback
MAX_BODY = 1024 * 1024  # a /health answer is a few bytes; past this, the fallback
_CONNECT_TIMEOUT = 30.0  # the probe's own deadline (health_timeout) cancels it sooner


class Unusual(Exception):
    """An answer this parser leaves to the fallback Getter."""


class ProbeProtocol(Protocol):
    """One kept connection: one request at a time, answered with (status, body)."""

    def __init__(self) -> None:
        self._answer: Deferred[tuple[int, bytes]] | None = None
        self._buf = bytearray()
        self._status = 0
        self._length: int | None = None  # body bytes expected; None: chunked or to the close
        self._chunked = False
        self._body = bytearray()
        self._head_done = False
        self._close_after = False
        self.requests = 0  # requests sent on this connection
        self.lost = False

    def request(self, data: bytes) -> Deferred[tuple[int, bytes]]:
        """Send a prebuilt request; fires with (status, body) or fails (ResponseFailed, or
        Unusual for the fallback). The connection is dropped on any failure."""
        assert self._answer is None and not self.lost
        self._answer = Deferred()
        self._buf.clear()
        self._body.clear()
        self._head_done = False
        self.requests += 1
        self.transport.write(data)  # type: ignore[union-attr]
        return self._answer

    def abort(self) -> None:
        """Drop the connection now (a cancelled probe); no answer fires."""
        self._answer = None
        if not self.lost:
            self.transport.abortConnection()  # type: ignore[union-attr]

    def dataReceived(self, data: bytes) -> None:
        if self._answer is None:  # bytes nobody asked for: the connection cannot be trusted
            self.transport.abortConnection()  # type: ignore[union-attr]
            return
        self._buf += data
        try:
            done = self._parse()
        except Unusual as e:
            self._fail(Failure(e))
            return
        if done:
            answer, self._answer = self._answer, None
            if self._close_after or self._buf:  # closing, or more than the answer came
                self.transport.loseConnection()  # type: ignore[union-attr]
                self.lost = True  # not to be reused, whatever comes next
            answer.callback((self._status, bytes(self._body)))

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.lost = True
        answer, self._answer = self._answer, None
        if answer is None:
            return
        if self._head_done and self._length is None and not self._chunked:
            answer.callback((self._status, bytes(self._body)))  # a body up to the close
        elif self._head_done or self._buf:
            answer.errback(ResponseFailed([reason]))
        else:
            answer.errback(ResponseNeverReceived([reason]))

    def _fail(self, failure: Failure) -> None:
        answer, self._answer = self._answer, None
        self.lost = True
        self.transport.abortConnection()  # type: ignore[union-attr]
        if answer is not None:
            answer.errback(failure)

    def _parse(self) -> bool:
        """Consume what has come; True once the whole answer has."""
        if not self._head_done:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD:
                    raise Unusual("response head over 64 KiB")
                return False
            head, self._buf = bytes(self._buf[:end]), self._buf[end + 4 :]
            self._read_head(head)
            self._head_done = True
        if self._chunked:
            return self._read_chunks()
        if self._length is None:
            self._take(self._buf)
            self._buf = bytearray()
            return False  # until the close
        wanted = self._length - len(self._body)
        self._take(self._buf[:wanted])
        self._buf = self._buf[wanted:]
        return len(self._body) == self._length

    def _read_head(self, head: bytes) -> None:
        status_line, *lines = head.split(b"\r\n")
        version, _, rest = status_line.partition(b" ")
        code = rest[:3]
        if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit():
            raise Unusual("not an HTTP/1.x status line")
        self._status = int(code)
        if self._status < 200:
            raise Unusual("an informational answer")
        headers: dict[bytes, list[bytes]] = {}
        for line in lines:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip():
                raise Unusual("a malformed header line")
            headers.setdefault(name.lower(), []).append(value.strip())
        tokens = {t.strip().lower() for v in headers.get(b"connection", ()) for t in v.split(b",")}
        self._close_after = b"close" in tokens or (
            version == b"HTTP/1.0" and b"keep-alive" not in tokens
        )
        coding = headers.get(b"transfer-encoding")
        lengths = headers.get(b"content-length")
        self._chunked, self._length = False, None
        if self._status in (204, 304):
            self._length = 0
        elif coding is not None:
            if [c.lower() for c in coding] != [b"chunked"]:
                raise Unusual("a transfer coding other than chunked")
            self._chunked = True
        elif lengths is not None:
            if len(set(lengths)) != 1 or not lengths[0].isdigit():
                raise Unusual("a bad Content-Length")
            self._length = int(lengths[0])
            if self._length > MAX_BODY:
                raise Unusual("a body over 1 MiB")
        else:
            self._close_after = True  # the body runs to the close

    def _read_chunks(self) -> bool:
        buf = self._buf
        while True:
            if self._length is None:  # at a chunk-size line
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > 1024:
                        raise Unusual("a chunk-size line over 1 KiB")
                    return False
                size = bytes(buf[:end]).split(b";")[0].strip()
                try:
                    self._length = int(size, 16)
                except ValueError:
                    raise Unusual("a bad chunk size") from None
                del buf[: end + 2]
            if self._length == 0:  # the last chunk: trailers up to an empty line
                end = buf.find(b"\r\n\r\n") if buf[:2] != b"\r\n" else -2
                if end == -1:
                    if len(buf) > MAX_HEAD:
                        raise Unusual("trailers over 64 KiB")
                    return False
                del buf[: end + 4]
                self._length = None
                return True
            if len(buf) < self._length + 2:
                return False
            if buf[self._length : self._length + 2] != b"\r\n":
                raise Unusual("a chunk not followed by CRLF")
            self._take(buf[: self._length])
            del buf[: self._length + 2]
            self._length = None

    def _take(self, data: bytes | bytearray) -> None:
        self._body += data
        if len(self._body) > MAX_BODY:
            raise Unusual("a body over 1 MiB")


class _Factory(Factory):
    noisy = False  # no "Starting factory" line per connection
    protocol = ProbeProtocol


class LeanGetter:
    """A Getter (see health.py): `.../health` over http on kept connections, the rest (and
    anything unusual) through `fallback`. `close` drops every kept connection."""

    def __init__(self, reactor: Any, fallback: Getter) -> None:
        self._fallback = fallback
        self._endpoints = HostEndpoints(reactor, _CONNECT_TIMEOUT)
        self._factory = _Factory()
        self._kept: dict[tuple[str, int], ProbeProtocol] = {}
        self._busy: set[tuple[str, int]] = set()
        self.fallbacks = 0  # requests handed to the fallback (for tests and benches)
        self.connects = 0  # connections opened

    def __call__(self, url: str, headers: Mapping[str, str]) -> Deferred[tuple[int, bytes]]:
        parts = urlsplit(url)
        lean = parts.scheme == "http" and parts.path.endswith("/health") and not parts.query
        request = _request(parts.netloc, parts.path, headers) if lean else None
        key = (parts.hostname or "", parts.port or 80) if lean else ("", 0)
        if request is None or key in self._busy:
            self.fallbacks += 1
            return self._fallback(url, headers)
        return _Probe(self, key, url, headers, request).done

    def close(self) -> Deferred[None]:
        """Drop the kept connections (crossbar is stopping)."""
        for protocol in self._kept.values():
            protocol.abort()
        self._kept.clear()
        return succeed(None)


class _Probe:
    """One GET: `done` fires with (status, body); it waits on a connect, an answer, or the
    fallback, and cancelling it cancels (or drops) whichever that is."""

    def __init__(
        self,
        getter: LeanGetter,
        key: tuple[str, int],
        url: str,
        headers: Mapping[str, str],
        request: bytes,
    ) -> None:
        self.getter, self.key, self.url = getter, key, url
        self.headers, self.request = headers, request
        self.done: Deferred[tuple[int, bytes]] = Deferred(self._cancel)
        self.waiting: Deferred[Any] | None = None
        self.cancelled = False
        self.protocol: ProbeProtocol | None = None
        getter._busy.add(key)
        kept = getter._kept.get(key)
        if kept is not None and not kept.lost:
            self._send(kept, retry=True)
        else:
            self._connect()

    def _connect(self) -> None:
        self.getter._kept.pop(self.key, None)
        self.getter.connects += 1
        uri = URI.fromBytes(self.url.encode("ascii"))
        connecting = self.getter._endpoints.endpointForURI(uri).connect(self.getter._factory)
        self.waiting = connecting
        connecting.addCallbacks(self._connected, self._finish)

    def _connected(self, protocol: ProbeProtocol) -> None:
        self.waiting = None
        self.getter._kept[self.key] = protocol
        self._send(protocol, retry=False)

    def _send(self, protocol: ProbeProtocol, retry: bool) -> None:
        self.protocol = protocol
        protocol.request(self.request).addBoth(self._answered, protocol, retry)

    def _answered(self, result: Any, protocol: ProbeProtocol, retry: bool) -> None:
        self.protocol = None
        if protocol.lost and self.getter._kept.get(self.key) is protocol:
            del self.getter._kept[self.key]
        if isinstance(result, Failure):
            if retry and result.check(ResponseNeverReceived):
                self._connect()  # the host closed the kept connection while it was idle
                return
            if result.check(Unusual):
                self.getter.fallbacks += 1
                self.getter._busy.discard(self.key)
                self.waiting = self.getter._fallback(self.url, self.headers)
                self.waiting.addBoth(self._from_fallback)
                return
        self._finish(result)

    def _from_fallback(self, result: Any) -> None:
        self.waiting = None
        if not self.cancelled:  # else `done` failed with CancelledError already
            self.done.callback(result)

    def _finish(self, result: Any) -> None:
        self.waiting = None
        if not self.cancelled:
            self.getter._busy.discard(self.key)
            self.done.callback(result)

    def _cancel(self, done: Deferred[Any]) -> None:
        self.cancelled = True  # what the cancelled connect or fallback says is not passed on
        self.getter._busy.discard(self.key)
        if self.protocol is not None:
            self.getter._kept.pop(self.key, None)
            self.protocol.abort()  # its answer will not fire: the connection goes
            self.protocol = None
        if self.waiting is not None:
            waiting, self.waiting = self.waiting, None
            waiting.cancel()


def _request(netloc: str, path: str, headers: Mapping[str, str]) -> bytes | None:
    """The request's bytes, or None when a header cannot go as is (the fallback decides)."""
    lines = [f"GET {path} HTTP/1.1", f"Host: {netloc}"]
    for name, value in headers.items():
        if not name.isprintable() or ":" in name or not value.isprintable():
            return None
        lines.append(f"{name}: {value}")
    try:
        return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
    except UnicodeEncodeError:
        return None
