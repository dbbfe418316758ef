"""Fakes and helpers for the lease, chooser and store tests."""

from __future__ import annotations

from collections.abc import Coroutine, Iterable
from typing import Any

from attrs import define, evolve, field
from twisted.internet import reactor
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.python.failure import Failure

from crossbar.leases.chooser import Chooser
from crossbar.leases.table import Key, Lease, Table
from crossbar.leases.types import Change, Written
from crossbar.records import LeaseEvent, UsageRow
from crossbar.store.database import Store, StoreError
from crossbar.store.rollups import RolledUp


@define
class FakeHosts:
    """Health and draining as two sets of host names (everything else healthy, not draining)."""

    down: set[str] = field(factory=set)
    drained: set[str] = field(factory=set)
    held: set[str] = field(factory=set)  # held out of new placements after flapping

    def healthy(self, name: str) -> bool:
        return name not in self.down

    def held_down(self, name: str) -> bool:
        return name in self.held

    def draining(self, name: str) -> bool:
        return name in self.drained


@define
class MemoryStore:
    """The store in memory (leases, events, draining, usage); its methods finish without
    waiting."""

    rows: dict[Key, Lease] = field(factory=dict)
    events: list[LeaseEvent] = field(factory=list)
    instance: str = ""
    draining: set[str] = field(factory=set)
    usage: list[UsageRow] = field(factory=list)
    fail: bool = False  # every write raises while set
    closed: bool = False
    durable: list[bool] = field(factory=list)  # each write: asked to be durable?
    keys: dict[str, Any] = field(factory=dict)
    dropped_rows: dict[str, int] = field(factory=dict)  # the real store's unstorable rows

    async def list_draining(self) -> set[str]:
        return set(self.draining)

    async def set_draining(self, name: str, draining: bool) -> None:
        if self.fail:
            raise StoreError("injected write failure")
        (self.draining.add if draining else self.draining.discard)(name)

    async def record_usage(self, row: UsageRow) -> None:
        await self.record_usage_rows([row])

    async def record_usage_rows(self, rows: list[UsageRow]) -> None:
        if self.fail:
            raise StoreError("injected write failure")
        self.usage.extend(rows)

    async def prune(
        self, events_before: float, usage_before: float, changes_before: float = 0.0
    ) -> tuple[int, int]:
        events = [e for e in self.events if e.at >= events_before]
        usage = [u for u in self.usage if u.at >= usage_before]
        pruned = (len(self.events) - len(events), len(self.usage) - len(usage))
        self.events, self.usage = events, usage
        return pruned

    async def roll_up(self, now: float, raw_before: float) -> RolledUp:
        """No per-minute sums here: the raw rows before `raw_before` just go."""
        kept = [u for u in self.usage if u.at >= raw_before]
        deleted, self.usage = len(self.usage) - len(kept), kept
        return RolledUp(0, deleted, True)

    async def close(self) -> None:
        self.closed = True

    async def ping(self) -> None:
        if self.fail:
            raise StoreError("injected write failure")

    async def list_leases(self) -> list[Lease]:
        return [evolve(lease) for lease in self.rows.values()]

    async def write(self, change: Change, durable: bool = False) -> Written:
        """What crossbar.store.Store.write does, in memory (no change log: one instance)."""
        if self.fail:
            raise StoreError("injected write failure")
        if change.expect is not None:
            key, had = change.expect
            current = self.rows.get(key)
            if (current.host if current is not None else "") != had:
                return Written(applied=False, current=evolve(current) if current else None)
        self.durable.append(durable)
        kept = set()
        for key in change.delete:
            row = self.rows.get(key)
            if change.idle_before is not None and row and row.last_used >= change.idle_before:
                kept.add(key)
            else:
                self.rows.pop(key, None)
        for lease in change.save:
            self.rows[lease.key] = evolve(lease)
        self.events.extend(e for e in change.events if Key(e.route, e.fp, e.model) not in kept)
        return Written(kept=frozenset(kept))

    async def apply(
        self,
        save: Iterable[Lease] = (),
        delete: Iterable[Key] = (),
        events: Iterable[LeaseEvent] = (),
        durable: bool = False,
    ) -> None:
        await self.write(Change(list(save), list(delete), list(events)), durable)

    # The change log and heartbeats of a store nobody else shares.

    async def last_change(self) -> int:
        return 0

    async def changes_since(self, after: int, limit: int = 1000) -> list:
        return []

    async def heartbeat(self, row: Any) -> tuple[float, list]:
        return row.heartbeat, [row]

    async def forget_instance(self, instance: str) -> None:
        pass

    # No batches are ever made on this store: the batch runner's timer finds none.

    async def any_batch_running(self) -> bool:
        return False

    async def prune_batches(self, before: float) -> int:
        return 0

    async def release_claims(self, token: str) -> int:
        return 0

    # Client keys, in memory: the config's seeded, nothing shared.

    async def list_keys(self, names: Iterable[str] | None = None) -> list:
        wanted = None if names is None else set(names)
        return [k for n, k in sorted(self.keys.items()) if wanted is None or n in wanted]

    async def seed_keys(self, seeds: list) -> list:
        for name in [n for n, k in self.keys.items() if k.source == "config"]:
            del self.keys[name]
        self.keys.update({k.name: k for k in seeds})
        return await self.list_keys()

    async def create_key(self, key: Any) -> bool:
        return self.keys.setdefault(key.name, key) is key

    async def save_key(self, key: Any) -> None:
        self.keys[key.name] = key

    async def delete_key(self, name: str) -> bool:
        return self.keys.pop(name, None) is not None

    async def sync_spend(self, rows: list, periods: list) -> dict:
        return {}


@define
class FailingStore:
    """Wraps a store; while `fail` is set, writes raise StoreError and change nothing."""

    inner: Any
    fail: bool = False
    writes: int = 0
    tries: int = 0  # writes and pings tried, failed or not

    async def list_leases(self) -> list[Lease]:
        return await self.inner.list_leases()

    async def write(self, change: Change, durable: bool = False) -> Written:
        self.tries += 1
        if self.fail:
            raise StoreError("injected write failure")
        self.writes += 1
        return await self.inner.write(change, durable)

    async def ping(self) -> None:
        self.tries += 1
        if self.fail:
            raise StoreError("injected write failure")
        await self.inner.ping()


@define
class HeldStore:
    """Wraps a store; writes that `hold` picks wait until the test lets them go."""

    inner: Any
    hold: Any = lambda save, delete, events: True
    held: list[tuple[Deferred, tuple]] = field(factory=list)

    async def list_leases(self) -> list[Lease]:
        return await self.inner.list_leases()

    async def write(self, change: Change, durable: bool = False) -> Written:
        parts = (list(change.save), list(change.delete), list(change.events))
        if self.hold(*parts):
            gate: Deferred[None] = Deferred()
            self.held.append((gate, parts))
            await gate
        return await self.inner.write(change, durable)

    async def ping(self) -> None:
        await self.inner.ping()

    def let_go(self) -> None:
        """Let every held write proceed, oldest first."""
        while self.held:
            gate, _ = self.held.pop(0)
            gate.callback(None)


def run_now(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never really waits (a MemoryStore behind it) and return its result."""
    results: list[Any] = []
    ensureDeferred(coro).addBoth(results.append)
    assert results, "the coroutine waited for something"
    if isinstance(results[0], Failure):
        results[0].raiseException()
    return results[0]


@define
class FakeCapacity:
    """Slots per host as dicts (parallel 1, nothing free, nothing in flight or queued unless
    said)."""

    parallel_of: dict[str, int] = field(factory=dict)
    free: dict[str, int] = field(factory=dict)
    running: dict[str, int] = field(factory=dict)
    waiting: dict[str, int] = field(factory=dict)

    def parallel(self, host: str, model: str) -> int:
        return self.parallel_of.get(host, 1)

    def free_slots(self, host: str, model: str) -> int:
        return self.free.get(host, 0)

    def in_flight(self, host: str, model: str) -> int:
        return self.running.get(host, 0)

    def queued(self, host: str, model: str) -> int:
        return self.waiting.get(host, 0)

    def batch_room(self, host: str, model: str, route: str = "") -> int:
        return self.free_slots(host, model) - self.queued(host, model)


async def make_table(
    store: Any,
    hosts: FakeHosts | None = None,
    idle: float = 3600.0,
    parallel: dict[str, int] | None = None,
    free: dict[str, int] | None = None,
) -> Table:
    capacity = FakeCapacity(parallel or {}, free or {})
    return await Table.load(store, hosts or FakeHosts(), Chooser(capacity), idle)


async def open_store(path: str = ":memory:") -> Store:
    return await Store.open(path, reactor)


async def story(store: Store) -> list[tuple[str, str, str, str, str]]:
    """The store's lease events, oldest first, as (reason, route, fp, from_host, to_host)."""
    events = await store.list_events(limit=10_000)
    return [(e.reason, e.route, e.fp, e.from_host, e.to_host) for e in reversed(events)]


def hosts_of(table: Table) -> dict[tuple[str, str, str], str]:
    """The table's leases as {(route, fp, model): host}."""
    return {(x.key.route, x.key.fp, x.key.model): x.host for x in table.snapshot()}


def empty_table() -> Table:
    """A lease table over an empty store in memory, for tests that fill its memory directly."""
    return run_now(Table.load(MemoryStore(), FakeHosts(), Chooser(FakeCapacity()), 3600.0))
