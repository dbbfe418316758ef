"""The running parts of crossbar that the proxy, the admin API and the service share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attrs import define, field
from twisted.internet.defer import ensureDeferred
from twisted.logger import Logger

from crossbar.config import Config
from crossbar.guard import ContextGuard
from crossbar.ids import IdMemory
from crossbar.lease import UnknownHost
from crossbar.records import UsageRow

log = Logger(namespace="crossbar")


class UnknownRoute(KeyError):
    """No concrete route or template serves this name."""

    def __init__(self, route: str) -> None:
        super().__init__(route)
        self.route = route

    def __str__(self) -> str:
        return f"unknown route {self.route!r}"


@define
class App:
    """Config (replaced on reload), store, lease table, hosts, limiter, upstream client, clock."""

    config: Config
    clock: Any
    store: Any
    table: Any
    hosts: Any
    limiter: Any
    upstream: Any
    ids: IdMemory  # completion/response id -> host memory
    guard: ContextGuard
    observers: list[Callable[[UsageRow], None]] = field(factory=list)

    async def pin(self, route: str, host: str) -> None:
        """The operator pins `route` to `host`, one of the route's configured hosts.

        Raises UnknownRoute, or lease.UnknownHost for a host the route does not name (a pin
        never sends a route somewhere its config does not allow)."""
        resolved = self.config.route(route)
        if resolved is None:
            raise UnknownRoute(route)
        if host not in resolved.hosts:
            raise UnknownHost(route, host)
        self.table.note_candidates(route, resolved.hosts)
        await self.table.pin(route, host, self.clock.seconds())

    def record(self, row: UsageRow) -> None:
        """Hand a finished request's row to the observers and the store (never blocking)."""
        for observer in self.observers:
            try:
                observer(row)
            except Exception:
                log.failure("usage observer failed")
        d = ensureDeferred(self.store.record_usage(row))
        d.addErrback(lambda f: log.failure("could not record usage", f))
