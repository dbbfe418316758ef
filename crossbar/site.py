"""Sites that bound request bodies while they arrive: the proxy's and the admin API's."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from attrs import frozen
from twisted.web.http_headers import Headers
from twisted.web.server import Request, Site

from crossbar import cors
from crossbar.channel import ProxyChannel
from crossbar.config import Config
from crossbar.dialects import ErrorShape, classify
from crossbar.errors import ClientError, phrase
from crossbar.inbound import header_reader
from crossbar.routing import split_route
from crossbar.twisted_private import request_line_path
from crossbar.units import format_size


def _too_large(limit: int) -> ClientError:
    return ClientError(
        413,
        "invalid_request_error",
        f"request body is larger than this server's limit of {format_size(limit)}",
    )


@frozen
class _Answer:
    """Just the response headers of an answer written by hand."""

    responseHeaders: Headers  # the name Request gives them


class BoundedRequest(Request):
    """A Request that refuses a body over the site's `max_body` without reading the rest.

    twisted.web has no body limit of its own and spools large bodies to temporary files; here
    a Content-Length over the limit is refused as soon as the headers are in, a chunked body as
    soon as its size so far passes it, and the body is kept in memory (the limit bounds it).
    """

    _refused = False
    _received = 0

    def _limit(self) -> int:
        return self.channel.site.max_body

    def gotLength(self, length: int | None) -> None:
        self.content = io.BytesIO()
        if length is not None and length > self._limit():
            self._refuse()

    def handleContentChunk(self, data: bytes) -> None:
        if self._refused:
            return
        self._received += len(data)
        if self._received > self._limit():
            self._refuse()
            return
        self.content.write(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if self._refused:
            return
        super().requestReceived(command, path, version)

    def _refuse(self) -> None:
        """Answer 413 at once on the raw transport and close: the rest is never read."""
        self._refused = True
        status = 413
        site = self.channel.site
        body = _too_large(self._limit()).body(site.error_shape_of_line(self.channel))
        extra = b"".join(b"%s: %s\r\n" % pair for pair in site.refusal_headers(self))
        head = (
            b"HTTP/1.1 %d %s\r\n" % (status, phrase(status)) + b"Content-Type: application/json\r\n"
            b"Connection: close\r\n"
            + extra
            + b"Content-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
        )
        transport = self.channel.transport
        transport.write(head + body)
        transport.loseConnection()
        self.content = io.BytesIO()
        site.refused(self.channel, status, "request body too large")


class BoundedSite(Site):
    """A Site whose requests carry at most `max_body` bytes (read per request, so a reload
    applies at once)."""

    requestFactory = BoundedRequest

    def __init__(self, resource: Any, max_body: int, **kwargs: Any) -> None:
        super().__init__(resource, **kwargs)
        self.max_body = max_body
        self.noisy = False

    def error_shape_of_line(self, channel: Any) -> ErrorShape:
        """The error shape for a request refused before it was routed."""
        return ErrorShape.OPENAI

    def refusal_headers(self, request: Any) -> list[tuple[bytes, bytes]]:
        """Headers for a request refused before it was routed (its headers are in)."""
        return []

    def refused(self, channel: Any, status: int, why: str) -> None:
        """A request on `channel` was refused before it reached the resource."""


class ProxySite(BoundedSite):
    """The client-facing site: deadlines for slow clients (channel.py), its own log line per
    request (the usage observers), not twisted.web's access line; errors before routing in
    the client's own dialect."""

    protocol = ProxyChannel

    def __init__(self, resource: Any, config: Config, **kwargs: Any) -> None:
        # Bodies go to the host as they came: Twisted's parsing of POST forms into `args` (the
        # `email` package on every Content-Type, 6% of the proxy's CPU) is never needed.
        kwargs.setdefault("parsePOSTFormSubmission", False)
        super().__init__(resource, config.server.max_body, **kwargs)
        self.reconfigure(config)

    def reconfigure(self, config: Config) -> None:
        """A reload's limits apply from the next request on."""
        self._config = config
        s = config.server
        self.max_body = s.max_body
        self.header_timeout = s.header_timeout
        self.body_timeout = s.body_timeout

    # Told of each request refused before routing: (route or "", path, status, why).
    on_refused: Callable[[str, str, int, str], None] | None = None

    def refused(self, channel: Any, status: int, why: str) -> None:
        """Log and count it like any request (the usage observers), by the route its path
        names when the config has that route."""
        if self.on_refused is None:
            return
        raw = request_line_path(channel).split(b"?", 1)[0].decode("utf-8", "replace")
        name, path = "", raw
        try:
            name, path = split_route(self._config, raw, None)
        except ClientError:
            pass
        route = name if self._config.route(name) is not None else ""
        self.on_refused(route, path, status, why)

    def log(self, request: Any) -> None:
        # crossbar's request line says more; twisted.web's would repeat it at a tenth of the
        # proxy's CPU.
        pass

    def refusal_headers(self, request: Any) -> list[tuple[bytes, bytes]]:
        """The route's CORS headers, so a browser app can read its 413 too."""
        header = header_reader(request.requestHeaders)
        raw = request_line_path(request.channel).split(b"?", 1)[0].decode("utf-8", "replace")
        try:
            name, _ = split_route(self._config, raw, header("X-Crossbar-Route"))
        except ClientError:
            return []
        route = self._config.route(name)
        if route is None:
            return []
        answer = Headers()
        cors.mark(_Answer(answer), route, header)
        return [(k, v) for k, values in answer.getAllRawHeaders() for v in values]

    def error_shape_of_line(self, channel: Any) -> ErrorShape:
        raw = request_line_path(channel).split(b"?", 1)[0].decode("utf-8", "replace")
        try:
            _, path = split_route(self._config, raw, None)
        except ClientError:
            path = raw
        return classify("POST", path)[0].errors
