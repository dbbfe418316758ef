"""Following the other instances sharing the store: their lease, pin and draining changes,
read from the change log and applied to this instance's memory.

A run reads the rows after the last one seen, in order. Rows this instance wrote are skipped
(their effect is in memory already); the table skips a row for a key this instance has written
since. Rows are pruned after a while (app/sweep.py): an instance that fell further behind
than that (a long stall) reloads every lease from the store instead.
"""

from __future__ import annotations

from typing import Protocol

from twisted.logger import Logger

from crossbar.leases import Key, Lease, LeaseMemory
from crossbar.store import ChangeRow, StoreError

FOLLOW_EVERY = 0.25  # seconds between reads: changes reach the others well within a second
_BATCH = 5000
log = Logger(namespace="crossbar.follow")


class ChangeLog(Protocol):
    """What the follower reads of crossbar.store.Store."""

    async def changes_since(self, after: int, limit: int = 1000) -> list[ChangeRow]: ...

    async def last_change(self) -> int: ...

    async def list_leases(self) -> list[Lease]: ...

    async def list_draining(self) -> set[str]: ...


class Draining(Protocol):
    """Where draining flags other instances set go (crossbar.hosts.Hosts)."""

    def remote_draining(self, name: str, draining: bool) -> None: ...

    def replace_draining(self, names: set[str]) -> None: ...


class KeyRefresh(Protocol):
    """Where client key changes other instances made go (crossbar.tenants.Tenants)."""

    async def refresh(self, names: set[str]) -> None: ...

    async def resync(self) -> None: ...


class Follower:
    """Applies other instances' changes; `run` once per FOLLOW_EVERY (a timer of the service).
    `since` is the change number read before the table loaded its leases."""

    def __init__(
        self,
        store: ChangeLog,
        memory: LeaseMemory,
        hosts: Draining,
        instance: str,
        since: int,
        keys: KeyRefresh | None = None,
    ) -> None:
        self._store = store
        self._memory = memory
        self._hosts = hosts
        self._instance = instance
        self._keys = keys
        self._stale_keys: set[str] = set()  # keys the others changed, to read again
        self.seen = since  # the last change number applied
        self.applied = 0  # rows of other instances applied since start

    async def run(self) -> int:
        """Read and apply what is new; returns how many rows of other instances it applied.
        A store that cannot be read is left to the journal to report: nothing is raised."""
        try:
            rows = await self._store.changes_since(self.seen, _BATCH)
            if rows and rows[0].id > self.seen + 1:
                await self._resync()
                return 0
        except StoreError:
            return 0
        applied = 0
        for row in rows:
            if row.instance != self._instance:
                if row.kind == "key":
                    self._stale_keys.add(row.route)
                else:
                    self._apply(row)
                applied += 1
            self.seen = row.id
        if self._stale_keys and self._keys is not None:
            stale, self._stale_keys = self._stale_keys, set()
            try:
                await self._keys.refresh(stale)
            except StoreError:
                self._stale_keys |= stale  # read again next time
        self._memory.caught_up(self.seen)
        self.applied += applied
        return applied

    def _apply(self, row: ChangeRow) -> None:
        if row.kind == "lease":
            key = Key(row.route, row.fp, row.model)
            self._memory.apply_remote(row.lease(), key, row.id)
        elif row.kind == "drain":
            self._hosts.remote_draining(row.route, bool(row.host))

    async def _resync(self) -> None:
        """Rows we never read were pruned: take the store's whole state instead."""
        since = await self._store.last_change()
        leases = await self._store.list_leases()
        draining = await self._store.list_draining()
        log.warn(
            "the change log was pruned past what this instance had read (change {seen}); "
            "reloaded {n} leases from the store",
            seen=self.seen,
            n=len(leases),
        )
        self._memory.replace_all(leases)
        self._hosts.replace_draining(draining)
        if self._keys is not None:
            await self._keys.resync()
        self.seen = since
