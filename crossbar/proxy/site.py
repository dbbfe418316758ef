"""The proxy's site and the admin API's, over crossbar's own HTTP/1.1 channel (channel.py).

Each body is bounded by its site's `max_body`, and the bytes of the bodies of both sites
together by `max_body_memory` (one `BodyMemory`, request.py, taken as bytes arrive): a body
that does not fit gets 503 with Retry-After (before it is read when its declared length says
so), rather than a paused read: a paused body holds what it took and the client's own timers
run, and bodies that each wait for another's bytes could all wait until their deadlines; a
503 frees everything at once, and OpenAI's and Anthropic's SDKs retry it by themselves.

Requests refused before routing are counted each (`on_refused`) and logged as the usage
recorder's `RefusalLog` allows: a few per client a minute, then one line for the rest.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote_to_bytes

from attrs import frozen
from twisted.web.server import Request, Site

from crossbar.config import Config
from crossbar.proxy import cors
from crossbar.proxy.channel import ProxyChannel
from crossbar.proxy.held import BodyMemory, HeldBody, HoldsBody
from crossbar.proxy.request import ProxyRequest
from crossbar.proxy.routing import split_route
from crossbar.wire import (
    ClientError,
    ErrorShape,
    RawHeaders,
    bad_request,
    classify,
    header_reader,
    request_headers,
    write_error,
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
    peer: str = ""  # the client's address


@frozen
class _Answer:
    """Just the response headers of an answer written by hand."""

    responseHeaders: RawHeaders  # the name Request gives them


class BoundedRequest(HoldsBody, Request):
    """twisted.web's Request (the admin API's, for Klein) with its body bounded as the proxy's
    is (request.py `HeldBody`): refused (413, 503) before the bytes over the bound are read,
    kept in memory (the bounds bound it) where twisted.web would spool it to a file."""

    def headers_received(self, pairs: list[tuple[bytes, bytes]]) -> None:
        self.requestHeaders = request_headers(pairs)

    def gotLength(self, length: int | None) -> None:
        self._body = HeldBody()
        if length is not None:
            self._declare(length)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if self._refused:
            return
        self.content = io.BytesIO(self._body.content())
        self.content.seek(0, 2)  # twisted.web reads the length from where the body ends
        super().requestReceived(command, path, version)

    def finish(self) -> None:
        self._body.release()
        super().finish()

    def connectionLost(self, reason: Any) -> None:
        body = getattr(self, "_body", None)
        if body is not None:
            body.release()
        super().connectionLost(reason)


class BoundedSite(Site):
    """A Site whose connections keep the channel's deadlines and framing rules (channel.py)
    and whose requests carry at most `max_body` bytes, within what `memory` has left (both
    read per request, so a reload applies at once). Sites given one `memory` share it."""

    protocol = ProxyChannel
    requestFactory: Any = BoundedRequest

    def __init__(
        self,
        resource: Any,
        config: Config,
        max_body: int,
        memory: BodyMemory | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(resource, **kwargs)
        self.max_body = max_body
        self.memory = memory if memory is not None else BodyMemory(config.server.max_body_memory)
        self.noisy = False
        self.reconfigure(config)

    def reconfigure(self, config: Config) -> None:
        """A reload's deadlines and memory bound apply from the next request on (bytes held
        stay held)."""
        s = config.server
        self.header_timeout = s.header_timeout
        self.body_timeout = s.body_timeout
        self.body_deadline = s.body_deadline
        self.memory.limit = s.max_body_memory

    def refusal(self, channel: Any, request: Any = None) -> Refusal:
        """What a request refused before it reached the resource was for (`request`: its
        headers are in): read once per refusal."""
        return Refusal()

    def refused(self, refusal: Refusal, status: int, why: str) -> None:
        """A request was refused before it reached the resource."""


class ProxySite(BoundedSite):
    """The client-facing site: lean requests for its one leaf resource (request.py), its own
    log line per request (the usage observers), not twisted.web's access line; errors before
    routing in the client's own dialect."""

    requestFactory = ProxyRequest

    def __init__(
        self, resource: Any, config: Config, memory: BodyMemory | None = None, **kwargs: Any
    ) -> None:
        # Bodies go to the host as they came: Twisted's parsing of POST forms into `args` (the
        # `email` package on every Content-Type, 6% of the proxy's CPU) is never needed.
        kwargs.setdefault("parsePOSTFormSubmission", False)
        super().__init__(resource, config, config.server.max_body, memory, **kwargs)

    def reconfigure(self, config: Config) -> None:
        """A reload's limits apply from the next request on."""
        super().reconfigure(config)
        self._config = config
        self.max_body = config.server.max_body

    # Told of each request refused before routing: (route or "", path, status, why, the
    # client's address).
    on_refused: Callable[[str, str, int, str, str], None] | None = None

    def refusal(self, channel: Any, request: Any = None) -> Refusal:
        """Its route from its request line (or its X-Crossbar-Route header when the headers
        are in), the dialect its path names, the route's CORS headers."""
        raw = channel.path.split(b"?", 1)[0].decode("utf-8", "replace")
        header = header_reader(request.requestHeaders) if request is not None else None
        try:
            name, path = split_route(
                self._config, raw, header("X-Crossbar-Route") if header else None
            )
        except ClientError:
            name, path = "", raw
        route = self._config.route(name) if name else None
        shape = classify("POST", path)[0].errors
        peer = getattr(channel.getPeer(), "host", "") or ""
        if route is None or header is None:
            return Refusal("" if route is None else name, path, shape, peer=peer)
        answer = RawHeaders()
        cors.mark(_Answer(answer), route, header)
        headers = tuple(answer.pairs())
        return Refusal(name, path, shape, headers, peer)

    def refused(self, refusal: Refusal, status: int, why: str) -> None:
        """Log and count it like any request (the usage observers), by the route its path
        names when the config has that route."""
        if self.on_refused is not None:
            self.on_refused(refusal.route, refusal.path, status, why, refusal.peer)

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
