"""The client-facing Site: a request body limit enforced while the body arrives."""

from __future__ import annotations

import io

from twisted.web.server import Request, Site

from crossbar.errors import ClientError
from crossbar.units import format_size


def _too_large(limit: int) -> ClientError:
    return ClientError(
        413,
        "invalid_request_error",
        f"request body is larger than this server's limit of {format_size(limit)}",
    )


class BoundedRequest(Request):
    """A Request that refuses a body over the site's `max_body` without reading the rest.

    twisted.web has no body limit of its own and spools large bodies to temporary files; here
    a Content-Length over the limit is refused as soon as the headers are in, a chunked body as
    soon as its size so far passes it, and the body is kept in memory (the limit bounds it).
    """

    _refused = False
    _received = 0

    def _limit(self) -> int:
        return getattr(self.channel.site, "max_body", 64 * 1024 * 1024)

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
        body = _too_large(self._limit()).body()
        head = (
            b"HTTP/1.1 413 Payload Too Large\r\n"
            b"Content-Type: application/json\r\n"
            b"Connection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
        )
        transport = self.channel.transport
        transport.write(head + body)
        transport.loseConnection()
        self.content = io.BytesIO()


class ProxySite(Site):
    """The client-facing Site; `max_body` is read per request so a reload applies at once."""

    requestFactory = BoundedRequest

    def __init__(self, resource, max_body: int, access_log: bool = True, **kwargs) -> None:
        super().__init__(resource, **kwargs)
        self.max_body = max_body
        self.noisy = False
        self.access_log = access_log

    def log(self, request) -> None:
        # The proxy logs its own line per request (route, host, lease, tokens); twisted.web's
        # access line would say it again at about a tenth of the proxy's CPU.
        if self.access_log:
            super().log(request)
