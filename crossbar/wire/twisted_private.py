"""The few private Twisted APIs crossbar relies on, each where no public one serves.

Each use has a test in tests/test_twisted_private.py, and pyproject.toml bounds Twisted from
above, so an upgrade that moves one of these fails a named test instead of a request.

- `RequestNotSent`: how the HTTP/1.1 client reports a pooled connection that was no longer
  usable when the request was handed to it (a keep-alive race, classified "reset").
- The response's `Connection` header: Twisted's client files it apart from
  `response.headers` (in its parser's `connHeaders`), yet RFC 9110 wants the headers it names
  dropped by a proxy. A protocol subclass keeps it on the response as `connection_headers`.
- The response parser's lines: Twisted's client takes any number of response headers of any
  size; the same subclass bounds them (`ParseError` past the bound, as for a bad status line),
  so a host answering garbage is told apart from a host that reset.
- The connection pool's `_factory`: the only way to have the pool build that protocol (and to
  make its factory quiet: one "Starting factory" log line per upstream connection is noise).
- The request line's path while headers arrive: a body refused for its size is answered
  before `Request.requestReceived` runs, and the answer's shape depends on the path.
- Why the server channel refused a request head: Twisted answers a bare 400 both for a head
  it cannot parse and for one over its header count or size limits; crossbar says 431 for
  the latter (`HTTPChannel._respondToBadRequestAndDisconnect` is overridden for that).
- Whether the server channel answers `Expect: 100-continue`: `HTTPChannel._send100Continue`
  is overridden so that a body refused at its headers is not asked for.
- The server channel's chunked decoder (`HTTPChannel._transferDecoder`): Twisted's is lenient
  (proxy/chunks.py says how) and has no hook for a chunk's declared size; it is replaced,
  with the same callbacks, by a strict one once the request's headers are in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.web._newclient import HTTP11ClientProtocol, ParseError, RequestNotSent
from twisted.web.client import HTTPConnectionPool, _HTTP11ClientFactory
from twisted.web.http import _ChunkedTransferDecoder
from twisted.web.http_headers import Headers

__all__ = [
    "MAX_RESPONSE_HEADERS",
    "MAX_RESPONSE_HEAD_BYTES",
    "RequestNotSent",
    "connection_headers",
    "head_too_large",
    "not_http",
    "quiet_pool",
    "replace_chunked_decoder",
    "request_line_path",
]

MAX_RESPONSE_HEADERS = 100
MAX_RESPONSE_HEAD_BYTES = 64 * 1024


def _bound(parser: Any) -> None:
    """Make `parser` fail with ParseError past MAX_RESPONSE_HEADERS header lines or
    MAX_RESPONSE_HEAD_BYTES of head, or on a line too long to be one."""
    seen = {"lines": 0, "bytes": 0}
    line_received = parser.lineReceived

    def counted(line: bytes) -> None:
        seen["lines"] += 1
        seen["bytes"] += len(line) + 2
        if seen["lines"] > MAX_RESPONSE_HEADERS + 2:  # the status line and the empty one
            raise ParseError("more than 100 response headers", line[:80])
        if seen["bytes"] > MAX_RESPONSE_HEAD_BYTES:
            raise ParseError("response headers over 64 KiB", line[:80])
        try:
            line_received(line)
        except (ValueError, KeyError) as e:  # a bad Content-Length, an unknown encoding...
            raise ParseError(f"bad response head: {e}", line[:80]) from e

    def too_long(line: bytes) -> None:
        raise ParseError("a response header line over 64 KiB", line[:80])

    parser.lineReceived = counted
    parser.MAX_LENGTH = MAX_RESPONSE_HEAD_BYTES
    parser.lineLengthExceeded = too_long


class _ConnectionHeadersProtocol(HTTP11ClientProtocol):
    def request(self, request: Any) -> Deferred:
        d = super().request(request)
        parser = getattr(self, "_parser", None)
        if parser is not None:
            _bound(parser)

            def keep(response: Any) -> Any:
                response.connection_headers = parser.connHeaders
                return response

            d.addCallback(keep)
        return d


class _QuietFactory(_HTTP11ClientFactory):
    noisy = False

    def buildProtocol(self, addr: Any) -> HTTP11ClientProtocol:
        return _ConnectionHeadersProtocol(self._quiescentCallback)


def quiet_pool(reactor: Any, persistent: bool) -> HTTPConnectionPool:
    """An HTTPConnectionPool whose connections keep the response's connection headers and
    whose factories log nothing."""
    pool = HTTPConnectionPool(reactor, persistent=persistent)
    pool._factory = _QuietFactory
    return pool


def connection_headers(response: Any) -> Headers | None:
    """The `Connection`-family headers of a response from a `quiet_pool` connection."""
    return getattr(response, "connection_headers", None)


def not_http(failure: Failure) -> str | None:
    """What was wrong with an answer that was not HTTP (a bad status line, a bad length, too
    many or too large headers), or None for any other failure."""
    reasons = [failure, *(getattr(failure.value, "reasons", None) or [])]
    for reason in reasons:
        if isinstance(reason, Failure) and reason.check(ParseError):
            error = reason.value
            detail = error.args[0] if error.args else "unreadable answer"
            return str(detail)
    return None


def request_line_path(channel: Any) -> bytes:
    """The path of a connection's current request line, available once the line is parsed
    (before `requestReceived` sets `request.path`); b"" before that."""
    return getattr(channel, "_path", b"") if channel is not None else b""


def head_too_large(channel: Any) -> bool:
    """True when a connection's request head passed Twisted's limits on header count or
    size (its answer to that is the same bare 400 as for any unparsable request)."""
    return (
        getattr(channel, "_receivedHeaderSize", 0) > channel.totalHeadersSize
        or getattr(channel, "_receivedHeaderCount", 0) > channel.maxHeaders
    )


# What makes a chunked body's decoder from Twisted's callbacks: (chunk data, the bytes after
# the body once it ended).
DecoderFactory = Callable[[Callable[[bytes], None], Callable[[bytes], None]], Any]


def replace_chunked_decoder(channel: Any, make: DecoderFactory) -> bool:
    """Give a server channel whose current request has a chunked body the decoder
    `make(data, finish)`, fed the callbacks Twisted's own decoder had; False (and nothing
    changed) when the body is not chunked."""
    decoder = getattr(channel, "_transferDecoder", None)
    if not isinstance(decoder, _ChunkedTransferDecoder):
        return False
    channel._transferDecoder = make(decoder.dataCallback, decoder.finishCallback)
    return True
