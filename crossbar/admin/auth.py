"""Who may use the admin API (docs/reference.md, "Admin API").

With `server.admin_token` set, a request must carry `Authorization: Bearer <token>` (compared in
constant time). Without one, only loopback clients are served, and two browser attacks on a
loopback service are refused as well: DNS rebinding (a page whose host name resolves to
127.0.0.1 reads the API as its own origin: the `Host` header must be a loopback name) and
cross-site requests (a page elsewhere POSTs to 127.0.0.1: a browser's `Origin`, `Sec-Fetch-Site`
and `Referer` must all say ours where they are sent).
The client address is the TCP peer; `X-Forwarded-For` is never believed.
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Any
from urllib.parse import urlsplit

from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress

from crossbar.wire import bearer, forbidden, unauthorized

_SAFE_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS"})


def check(request: Any, token: str) -> None:
    """Raise a 401 or 403 ClientError unless `request` may use the admin API."""
    if token:
        presented = bearer(_header(request, b"authorization"))
        if presented is None:
            raise unauthorized("the admin API needs an Authorization: Bearer <admin_token> header")
        if not hmac.compare_digest(presented.encode(), token.encode()):
            raise unauthorized("wrong admin token")
        return
    check_local(request)


def check_local(request: Any) -> None:
    """Raise a 403 ClientError unless `request` is a loopback client's, by a loopback name,
    and (for a browser's state-changing request) from our own origin."""
    if not is_loopback(request.getClientAddress()):
        raise forbidden(
            "the admin API answers only loopback clients while server.admin_token is empty; "
            "set a token to use it from elsewhere"
        )
    host = _header(request, b"host")
    if host is not None and not is_loopback_name(_hostname(host)):
        raise forbidden(
            f"the admin API is reached by loopback names only (not {host!r}) while "
            "server.admin_token is empty; use 127.0.0.1 or localhost, or set a token"
        )
    if request.method not in _SAFE_METHODS:
        refuse_cross_site(request, host)


def refuse_cross_site(request: Any, host: str | None) -> None:
    """Raise a 403 ClientError when a browser says a state-changing request comes from a page
    elsewhere: its `Origin` is another (or "null"), its `Sec-Fetch-Site` is `cross-site` or
    `same-site` (another port or subdomain: a different origin all the same), or its
    `Referer` is another origin's. A browser sends at least one of them; a script need not,
    and is held back by the loopback rule instead."""
    ours = (host or "").lower()
    origin = _header(request, b"origin")
    if origin is not None and (origin == "null" or urlsplit(origin).netloc.lower() != ours):
        raise forbidden(f"cross-site request from {origin!r} refused")
    site = (_header(request, b"sec-fetch-site") or "").lower()
    if site in ("cross-site", "same-site"):
        raise forbidden(f"cross-site request refused (Sec-Fetch-Site: {site})")
    referer = _header(request, b"referer")
    if referer is not None and urlsplit(referer).netloc.lower() != ours:
        raise forbidden("cross-site request refused (its Referer is another origin's)")


def is_loopback(address: Any) -> bool:
    """True for 127.0.0.0/8, ::1 (and IPv4-mapped loopback) and UNIX sockets."""
    if isinstance(address, UNIXAddress):
        return True
    if not isinstance(address, IPv4Address | IPv6Address):
        return False
    try:
        ip = ipaddress.ip_address(address.host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def is_loopback_name(name: str) -> bool:
    """localhost, *.localhost, or a loopback IP literal."""
    name = name.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _hostname(host: str) -> str:
    """The name part of a Host header: "127.0.0.1:8081" -> 127.0.0.1, "[::1]:8081" -> ::1."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _header(request: Any, name: bytes) -> str | None:
    value = request.getHeader(name)
    if value is None:
        return None
    return value.decode("latin-1") if isinstance(value, bytes) else value
