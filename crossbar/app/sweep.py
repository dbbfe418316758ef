"""The sweep: idle leases expire, old lease events and usage rows are pruned, and usage rows
are summed per minute before their raw rows go."""

from __future__ import annotations

from typing import Protocol

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from crossbar.config import Config
from crossbar.leases import StoreUnavailable, Table
from crossbar.store import RolledUp

log = Logger(namespace="crossbar.sweep")
# Change-log rows older than this go: an instance that fell further behind reloads the store.
CHANGES_RETENTION = 3600.0
# Roll-ups (an hour of usage each) per sweep at most: a day's backlog per sweep, so a store
# upgraded with a month of raw rows catches up within the hour at the default interval, and a
# long sweep_interval never falls behind.
ROLLUP_STEPS = 24


class PruningStore(Protocol):
    """What the sweep needs of the store."""

    async def prune(
        self, events_before: float, usage_before: float, changes_before: float = 0.0
    ) -> tuple[int, int]: ...

    async def roll_up(self, now: float, raw_before: float) -> RolledUp: ...


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
        # Raw rows older than usage_raw_retention go once summed per minute (those sums are
        # kept for usage_retention); never past usage_retention, should it be the shorter.
        raw_before = now - min(s.usage_raw_retention, s.usage_retention)
        for _ in range(ROLLUP_STEPS):  # each a short transaction: other writes go between
            rolled = await self._store.roll_up(now, raw_before)
            usage += rolled.deleted
            if rolled.caught_up:
                break
        if expired or events or usage:
            log.info(
                "sweep: {expired} leases expired; pruned {events} events, {usage} usage rows",
                expired=expired,
                events=events,
                usage=usage,
            )
        return expired, events, usage
