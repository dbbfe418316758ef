"""The sweep: idle leases expire, old lease events and usage rows are pruned."""

from __future__ import annotations

from typing import Protocol

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from crossbar.config import Config
from crossbar.journal import StoreUnavailable
from crossbar.lease import Table

log = Logger(namespace="crossbar.sweep")
# Change-log rows older than this go: an instance that fell further behind reloads the store.
CHANGES_RETENTION = 3600.0


class PruningStore(Protocol):
    """What the sweep needs of the store."""

    async def prune(
        self, events_before: float, usage_before: float, changes_before: float = 0.0
    ) -> tuple[int, int]: ...


class Sweep:
    """One sweep per `run`, on the injected clock; retention comes from the config."""

    def __init__(self, config: Config, table: Table, store: PruningStore, clock: IReactorTime):
        self._config = config
        self._table = table
        self._store = store
        self._clock = clock

    def reconfigure(self, config: Config) -> None:
        """Retention of the reloaded config from the next sweep on."""
        self._config = config

    async def run(self) -> tuple[int, int, int]:
        """Expire idle leases, prune events and usage; (expired, events, usage rows)."""
        now = self._clock.seconds()
        s = self._config.server
        try:
            expired = await self._table.expire_idle(now, s.sweep_batch)
        except StoreUnavailable:
            log.info("sweep: the store cannot be written; idle leases expire once it can")
            return 0, 0, 0
        events, usage = await self._store.prune(
            now - s.events_retention, now - s.usage_retention, now - CHANGES_RETENTION
        )
        if expired or events or usage:
            log.info(
                "sweep: {expired} leases expired; pruned {events} events, {usage} usage rows",
                expired=expired,
                events=events,
                usage=usage,
            )
        return expired, events, usage
