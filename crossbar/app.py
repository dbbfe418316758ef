"""The running parts of crossbar that the proxy, the admin API and the service share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attrs import define, field
from twisted.internet.defer import ensureDeferred
from twisted.logger import Logger

from crossbar.config import Config
from crossbar.records import UsageRow

log = Logger(namespace="crossbar")


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
    ids: Any = None  # completion/response id -> host memory
    guard: Any = None  # the context guard
    observers: list[Callable[[UsageRow], None]] = field(factory=list)

    def record(self, row: UsageRow) -> None:
        """Hand a finished request's row to the observers and the store (never blocking)."""
        for observer in self.observers:
            try:
                observer(row)
            except Exception:
                log.failure("usage observer failed")
        d = ensureDeferred(self.store.record_usage(row))
        d.addErrback(lambda f: log.failure("could not record usage", f))
