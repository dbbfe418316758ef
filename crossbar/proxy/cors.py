"""CORS per route (`cors_origins`): browser apps on other origins may call crossbar.

Off by default: a route without `cors_origins` answers no CORS header at all, and the
`Access-Control-*` headers a llama-server sends (its default is `*` for every origin) never
reach the client, so crossbar alone decides who may read its answers. On a route with
`cors_origins`, crossbar answers every `OPTIONS` itself (the preflight: 204, the allowed
methods and headers, `Access-Control-Max-Age`), never forwarding or leasing it; every other
answer (errors included) carries `Access-Control-Allow-Origin` for an allowed origin and
exposes the `X-Crossbar-*` headers to the page's script.
"""

from __future__ import annotations

import re
from typing import Any

from crossbar.config import Route
from crossbar.wire import HeaderReader, forbidden

METHODS = b"GET, POST, OPTIONS"
# Chromium caps a preflight's cache at two hours; longer would only be ignored.
MAX_AGE = b"7200"
EXPOSED = (
    b"X-Crossbar-Host, X-Crossbar-Lease, X-Crossbar-Queue-Ms, X-Crossbar-Key, X-Crossbar-Fallback, "
    b"X-Crossbar-Class, Retry-After"
)
# Allowed when the preflight names no headers. `*` would not cover Authorization (Fetch spec),
# so the names a preflight asks for are granted by name instead.
_BASE_HEADERS = b"Authorization, Content-Type, X-Api-Key, X-Crossbar-Conversation"
_TOKEN_LIST = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+(\s*,\s*[A-Za-z0-9!#$%&'*+.^_`|~-]+)*")


def allowed(route: Route, origin: str | None) -> bytes | None:
    """The `Access-Control-Allow-Origin` value for `origin` on `route`, or None."""
    if not origin or not route.cors_origins:
        return None
    if "*" in route.cors_origins:
        return b"*"
    if origin.rstrip("/").lower() in {o.lower() for o in route.cors_origins}:
        return origin.encode("latin-1")
    return None


def mark(request: Any, route: Route, header: HeaderReader) -> None:
    """Set the CORS headers of an answer (whoever writes it) on a CORS route."""
    if not route.cors_origins:
        return
    headers = request.responseHeaders
    if "*" not in route.cors_origins:
        headers.addRawHeader(b"vary", b"Origin")  # the answer differs by origin
    value = allowed(route, header("Origin"))
    if value is not None:
        headers.setRawHeaders(b"access-control-allow-origin", [value])
        headers.setRawHeaders(b"access-control-expose-headers", [EXPOSED])


def preflight(request: Any, route: Route, header: HeaderReader) -> int:
    """Answer an OPTIONS on a CORS route: 204 with what may be sent, for an allowed origin;
    403 (crossbar's error body) for another one. Returns the status."""
    origin = header("Origin")
    if origin and allowed(route, origin) is None:
        raise forbidden(
            f"origin {origin!r} may not call route {route.name!r}: the operator lists the "
            "allowed ones in the route's cors_origins"
        )
    headers = request.responseHeaders
    asked = (header("Access-Control-Request-Headers") or "").strip()
    names = asked.encode("latin-1") if asked and _TOKEN_LIST.fullmatch(asked) else _BASE_HEADERS
    headers.setRawHeaders(b"allow", [METHODS])
    headers.setRawHeaders(b"access-control-allow-methods", [METHODS])
    headers.setRawHeaders(b"access-control-allow-headers", [names])
    headers.setRawHeaders(b"access-control-max-age", [MAX_AGE])
    request.setResponseCode(204)
    request.finish()
    return 204
