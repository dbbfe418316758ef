"""A request as the proxy comes to understand it: what it is for, then what it asks of a host."""

from __future__ import annotations

from attrs import frozen

from crossbar.config import BATCH, STANDARD, Route
from crossbar.leases import Key
from crossbar.wire import Dialect, Inbound, Kind


@frozen
class Target:
    """What a request is for: its route, its API and what crossbar does with it (None: no
    such path), its method and its llama-server path."""

    route: Route
    dialect: Dialect
    kind: Kind | None
    method: str
    path: str


@frozen
class Call:
    """A request understood: its route, API, kind, model, conversation and lease key."""

    route: Route
    dialect: Dialect
    kind: Kind
    inbound: Inbound
    model: str
    key: Key
    candidates: tuple[str, ...]
    origin: str | None  # the host of the running completion a control call names
    need: int = 0  # prompt tokens expected (estimated from its characters), for placement
    opening: str = ""  # what its prompt begins with, hashed (fingerprint.opening_digest)
    fallback_from: str = ""  # the route it came for, when this is a fallback route's attempt
    # The fingerprint before a named key scoped it (fingerprint.scoped): the key a version
    # without scoping gave the conversation ("" when it is key.fp, or there is none).
    unscoped: str = ""
    request_class: str = STANDARD  # its class (proxy/classes.py), once known

    @property
    def batch(self) -> bool:
        """A batch request: placed where batch has room, never by or onto a lease."""
        return self.request_class == BATCH

    @property
    def conversation(self) -> bool:
        """The call has a lease of its own to take: it names a conversation, or its route
        shares one lease (affinity = "route"). Anything else never makes a lease."""
        return bool(self.key.fp) or self.route.per_route()
