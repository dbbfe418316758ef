"""Sites that bound request bodies while they arrive: the proxy's and the admin API's."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote_to_bytes

from attrs import frozen
from twisted.web.http_headers import Headers
from twisted.web.server import Request, Site

from crossbar.config import Config, format_size
from crossbar.proxy import cors
from crossbar.proxy.channel import ProxyChannel
from crossbar.proxy.routing import split_route
from crossbar.wire import (
    ClientError,
    ErrorShape,
    bad_request,
    classify,
    header_reader,
    phrase,
    request_line_path,
    write_error,
)


def _too_large(limit: int) -> ClientError:
    return ClientError(
        413,
        "invalid_request_error",
        f"request body is larger than this server's limit of {format_size(limit)}",
    )


@frozen
class Refusal:
    """A request refused before routing, as far as its request line (and headers) tell: its
    route ("" when none the config serves), its llama-server path, the shape its error takes
    and the headers its answer carries (CORS, for a browser app to read it)."""

    route: str = ""
    path: str = ""
    shape: ErrorShape = ErrorShape.OPENAI
    headers: tuple[tuple[bytes, bytes], ...] = ()


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
        refusal = site.refusal(self.channel, self)
        body = _too_large(self._limit()).body(refusal.shape)
        extra = b"".join(b"%s: %s\r\n" % pair for pair in refusal.headers)
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
        site.refused(refusal, status, "request body too large")


class BoundedSite(Site):
    """A Site whose connections keep the channel's deadlines and framing rules (channel.py)
    and whose requests carry at most `max_body` bytes (both read per request, so a reload
    applies at once)."""

    protocol = ProxyChannel
    requestFactory = BoundedRequest

    def __init__(self, resource: Any, config: Config, max_body: int, **kwargs: Any) -> None:
        super().__init__(resource, **kwargs)
        self.max_body = max_body
        self.noisy = False
        self.reconfigure(config)

    def reconfigure(self, config: Config) -> None:
        """A reload's deadlines apply from the next request on."""
        s = config.server
        self.header_timeout = s.header_timeout
        self.body_timeout = s.body_timeout
        self.body_deadline = s.body_deadline

    def refusal(self, channel: Any, request: Any = None) -> Refusal:
        """What a request refused before it reached the resource was for (`request`: its
        headers are in): read once per refusal."""
        return Refusal()

    def refused(self, refusal: Refusal, status: int, why: str) -> None:
        """A request was refused before it reached the resource."""


class ProxySite(BoundedSite):
    """The client-facing site: its own log line per request (the usage observers), not
    twisted.web's access line; errors before routing in the client's own dialect."""

    def __init__(self, resource: Any, config: Config, **kwargs: Any) -> None:
        # Bodies go to the host as they came: Twisted's parsing of POST forms into `args` (the
        # `email` package on every Content-Type, 6% of the proxy's CPU) is never needed.
        kwargs.setdefault("parsePOSTFormSubmission", False)
        super().__init__(resource, config, config.server.max_body, **kwargs)

    def reconfigure(self, config: Config) -> None:
        """A reload's limits apply from the next request on."""
        super().reconfigure(config)
        self._config = config
        self.max_body = config.server.max_body

    # Told of each request refused before routing: (route or "", path, status, why).
    on_refused: Callable[[str, str, int, str], None] | None = None

    def refusal(self, channel: Any, request: Any = None) -> Refusal:
        """Its route from its request line (or its X-Crossbar-Route header when the headers
        are in), the dialect its path names, the route's CORS headers."""
        raw = request_line_path(channel).split(b"?", 1)[0].decode("utf-8", "replace")
        header = header_reader(request.requestHeaders) if request is not None else None
        try:
            name, path = split_route(
                self._config, raw, header("X-Crossbar-Route") if header else None
            )
        except ClientError:
            name, path = "", raw
        route = self._config.route(name) if name else None
        shape = classify("POST", path)[0].errors
        if route is None or header is None:
            return Refusal("" if route is None else name, path, shape)
        answer = Headers()
        cors.mark(_Answer(answer), route, header)
        headers = tuple((k, v) for k, values in answer.getAllRawHeaders() for v in values)
        return Refusal(name, path, shape, headers)

    def refused(self, refusal: Refusal, status: int, why: str) -> None:
        """Log and count it like any request (the usage observers), by the route its path
        names when the config has that route."""
        if self.on_refused is not None:
            self.on_refused(refusal.route, refusal.path, status, why)

    def log(self, request: Any) -> None:
        # crossbar's request line says more; twisted.web's would repeat it at a tenth of the
        # proxy's CPU.
        pass


class AdminRequest(BoundedRequest):
    """An admin API request. Klein answers a path or Host that is not UTF-8 with an HTML 400
    and logs a traceback for it; here it is crossbar's JSON 400, and nothing is logged."""

    def process(self) -> None:
        why = _not_utf8(self)
        if why is None:
            super().process()
            return
        self.site = self.channel.site
        self.setHeader(b"Cache-Control", b"no-store")
        write_error(self, bad_request(why))


def _not_utf8(request: Any) -> str | None:
    """What of the request's path and Host is not UTF-8, or None."""
    try:
        unquote_to_bytes(request.path).decode("utf-8")
    except UnicodeDecodeError:
        return "the request's path is not UTF-8 once percent-decoded"
    try:
        request.getRequestHostname().decode("utf-8")
    except UnicodeDecodeError:
        return "the request's Host header is not UTF-8"
    return None


class AdminSite(BoundedSite):
    """The admin API's site: the proxy's connection rules, bodies of at most `max_body`, and
    errors in crossbar's (OpenAI's) shape."""

    requestFactory = AdminRequest
