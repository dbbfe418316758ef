"""The few private Twisted APIs crossbar relies on, each where no public one serves.

Each use has a test in tests/test_twisted_private.py, and pyproject.toml bounds Twisted from
above, so an upgrade that moves one of these fails a named test instead of a request.

- `RequestNotSent`: how the HTTP/1.1 client reports a pooled connection that was no longer
  usable when the request was handed to it (a keep-alive race, classified "reset").
- The response's `Connection` header: Twisted's client files it apart from
  `response.headers` (in its parser's `connHeaders`), yet RFC 9110 wants the headers it names
  dropped by a proxy. A protocol subclass keeps it on the response as `connection_headers`.
- The connection pool's `_factory`: the only way to have the pool build that protocol (and to
  make its factory quiet: one "Starting factory" log line per upstream connection is noise).
- The request line's path while headers arrive: a body refused for its size is answered
  before `Request.requestReceived` runs, and the answer's shape depends on the path.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.web._newclient import HTTP11ClientProtocol, RequestNotSent
from twisted.web.client import HTTPConnectionPool, _HTTP11ClientFactory
from twisted.web.http_headers import Headers

__all__ = ["RequestNotSent", "connection_headers", "quiet_pool", "request_line_path"]


class _ConnectionHeadersProtocol(HTTP11ClientProtocol):
    def request(self, request: Any) -> Deferred:
        d = super().request(request)
        parser = getattr(self, "_parser", None)
        if parser is not None:

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


def request_line_path(request: Any) -> bytes:
    """The path of the request line, available once the line is parsed (before
    `requestReceived` sets `request.path`)."""
    channel = request.channel
    return getattr(channel, "_path", b"") if channel is not None else b""
