"""Connections to hosts: TCP (or TLS) endpoints made once per host, with TCP_NODELAY."""

from __future__ import annotations

import ipaddress
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.endpoints import (
    HostnameEndpoint,
    TCP4ClientEndpoint,
    TCP6ClientEndpoint,
    wrapClientTLS,
)
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.web.client import BrowserLikePolicyForHTTPS
from twisted.web.iweb import IAgentEndpointFactory
from zope.interface import implementer

from crossbar.config import HostConfig


def no_delay(transport: Any) -> None:
    """TCP_NODELAY on `transport` when it is TCP (not a UNIX socket, not a test's memory)."""
    set_no_delay = getattr(transport, "setTcpNoDelay", None)
    if set_no_delay is not None:
        try:
            set_no_delay(True)
        except OSError:
            pass  # not a TCP socket after all (a UNIX one): nothing to do


@implementer(IStreamClientEndpoint)
class _NoDelay:
    """Connections with TCP_NODELAY: a request's head and body are separate small writes,
    which Nagle would hold for the host's delayed ACK."""

    def __init__(self, inner: IStreamClientEndpoint) -> None:
        self._inner = inner

    def connect(self, factory: Any) -> Deferred:
        def opened(protocol: Any) -> Any:
            no_delay(protocol.transport)
            return protocol

        return self._inner.connect(factory).addCallback(opened)


@implementer(IAgentEndpointFactory)
class HostEndpoints:
    """TCP (or TLS) endpoints per (scheme, host, port), made once each: building one
    IDNA-encodes the host name, a few percent of the proxy's CPU when done per request."""

    def __init__(self, reactor: Any, connect_timeout: float) -> None:
        self._reactor = reactor
        self._timeout = connect_timeout
        self._cache: dict[tuple[bytes, bytes, int], IStreamClientEndpoint] = {}
        self._tls: BrowserLikePolicyForHTTPS | None = None

    def _tcp(self, host: str, port: int) -> IStreamClientEndpoint:
        # An address needs no name lookup: HostnameEndpoint would still ask getaddrinfo, in a
        # thread, for every new connection (8% of the proxy's CPU while 200 streams opened).
        literal = host.strip("[]")
        try:
            ipaddress.IPv4Address(literal)
            return TCP4ClientEndpoint(self._reactor, literal, port, timeout=self._timeout)
        except ValueError:
            pass
        try:
            ipaddress.IPv6Address(literal)
            return TCP6ClientEndpoint(self._reactor, literal, port, timeout=self._timeout)
        except ValueError:
            return HostnameEndpoint(self._reactor, host, port, timeout=self._timeout)

    def endpointForURI(self, uri: Any) -> IStreamClientEndpoint:
        key = (uri.scheme, uri.host, uri.port)
        endpoint = self._cache.get(key)
        if endpoint is None:
            endpoint = _NoDelay(self._tcp(uri.host.decode("ascii"), uri.port))
            if uri.scheme == b"https":
                self._tls = self._tls or BrowserLikePolicyForHTTPS()
                endpoint = wrapClientTLS(self._tls.creatorForNetloc(uri.host, uri.port), endpoint)
            self._cache[key] = endpoint
        return endpoint


def authorization(host: HostConfig) -> dict[str, str]:
    """The header that authenticates crossbar to the host: its `api_key` as a Bearer token.
    Every request to the host carries it: proxied ones, probes, discovery, token counts."""
    return {"Authorization": f"Bearer {host.api_key}"} if host.api_key else {}
