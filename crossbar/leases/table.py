"""The sticky lease table: which host each conversation is on, and keeping it there
(docs/reference.md, "Leases").

A lease moves only when its host is unhealthy, when it has been idle longer than `idle`, when
an operator pins or releases its route, or when crossbar moves it outside `acquire`: a warm
hand-off or the valve (`move`), a conversation its host evicted (`rehome`), a lease its first
request could not use (`undo`). Every change goes to the store (through the
journal, journal.py) and is applied to memory only once it is written, so a restart
(`Table.load`) moves nobody. While the store cannot be written, changes that serve clients
(leases made, moved, touched; hosts a reload removed) are applied to memory and kept by the
journal until the store recovers, and the operator's changes and the sweep's expiry are
refused (StoreUnavailable) and change nothing.

Concurrency: `acquire` holds a per-key lock across its write, so calls for one key resolve to
one host while other keys go on. Route-wide operations (pin, release, expiry) take no lock:
each applies to memory exactly the change it wrote, and the store completes writes in the
order they were submitted, so memory replays the store's history. A stale decision is healed
by the next acquire (a lease left on another host under a pin moves to the pin). Instances
sharing a store: a lease is made or moved only if the store still has it where this instance
thinks (else the other instance's row is adopted), expiry spares leases used elsewhere since,
and each instance follows the others' changes (cluster/follower.py, memory.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING

from attrs import evolve
from twisted.internet.defer import CancelledError
from twisted.internet.task import Clock, deferLater
from twisted.logger import Logger

from crossbar.leases.expiry import idle_batches
from crossbar.leases.journal import Journal, shielded
from crossbar.leases.locks import KeyLocks
from crossbar.leases.memory import LeaseMemory, gc_paused
from crossbar.leases.types import (
    Acquired,
    Change,
    HostChooser,
    HostStates,
    Key,
    Lease,
    LeaseError,
    LeaseStore,
    NoHost,
    PinnedDown,
    State,
    UnknownHost,
    Written,
    pin_key,
)
from crossbar.records import LeaseEvent

if TYPE_CHECKING:
    from crossbar.config import Config

__all__ = ["Acquired", "Key", "Lease", "LeaseError", "NoHost", "PinnedDown", "State", "Table"]
__all__ += ["UnknownHost", "pin_key"]

_log = Logger()
_RETRIES = 3  # decisions an acquire may lose to other instances before it stops catching


class _Lost(Exception):
    """Another instance wrote the key first; its row is in memory now."""


class Table:
    """The lease table. Build it with `await Table.load(...)`."""

    def __init__(
        self,
        journal: Journal,
        hosts: HostStates,
        chooser: HostChooser,
        idle: float,
    ) -> None:
        self.memory = LeaseMemory()  # what the table holds; the follower brings it up to date
        self._index = self.memory.index
        self._journal = journal
        self._hosts = hosts
        self._chooser = chooser
        self._idle = idle
        # Writing last_used on every request would cost a store write per request, so a reused
        # lease's last_used is persisted only once it advanced by more than this; expiry reads
        # the in-memory value, so at worst a restart (or another instance sharing the store)
        # expires a lease this much early.
        self._touch_every = min(60.0, idle / 100)
        self._locks = KeyLocks()
        # Leases chosen and being written, per (host, model): they count for their host from
        # the moment they are chosen, so conversations arriving together spread as they would
        # one by one (a lease counts in the index only once its write has landed).
        self._placing: Counter[tuple[str, str]] = Counter()
        # Called with each event once its change takes effect: written, or kept in memory while
        # the store fails (metrics).
        self.listeners: list[Callable[[LeaseEvent], None]] = []
        journal.landed_late.append(self._landed_late)

    @classmethod
    async def load(
        cls,
        store: LeaseStore,
        hosts: HostStates,
        chooser: HostChooser,
        idle: float,
        journal: Journal | None = None,
    ) -> Table:
        """A table holding the store's leases and pins (rows with fp == model == "", PINNED).

        Its changes go through `journal` (one on the service's clock in production; without
        one, a journal whose retries wait for a clock nobody advances: tests and tools)."""
        journal = journal or Journal(store, Clock())
        table = cls(journal, hosts, chooser, idle)
        with gc_paused():
            table.memory.load(await store.list_leases())
        return table

    # -- reading (what the memory holds)

    def __len__(self) -> int:
        """Leases held (pins excluded)."""
        return len(self._index)

    def pinned(self, route: str) -> str | None:
        """The host `route` is pinned to, if any."""
        return self.memory.pinned(route)

    def pins(self) -> dict[str, str]:
        """route -> pinned host."""
        return self.memory.pins()

    def snapshot(self, route: str | None = None) -> list[Lease]:
        """Copies of the leases (of `route`, or all), sorted by route, fp, model; no pins."""
        return self.memory.snapshot(route)

    def lease(self, key: Key) -> Lease | None:
        """The lease held under `key` (not a copy: read it, never change it), or None."""
        return self._index.get(key)

    def keys(self, route: str | None = None) -> list[Key]:
        """The keys of the leases (of `route`, or all), unsorted: a cheap copy to page over."""
        return self._index.keys(route)

    def routes(self) -> list[str]:
        """The routes holding leases, sorted (a shared list: do not change it)."""
        return self._index.routes()

    def count(self, host: str, model: str) -> int:
        """Leases of every route held on `host` for `model` (O(1))."""
        return self._index.count(host, model)

    def count_where(self, route: str | None, host: str | None, model: str | None) -> int:
        """Leases of `route` on `host` for `model` (None: any), counted without a scan."""
        return self._index.count_where(route, host, model)

    def leases_by_route(self) -> dict[str, dict[str, int]]:
        """route -> host -> leases held, from the index's counters (no scan of the leases)."""
        return self._index.route_hosts()

    def hosts_with_lease(self, routes: Iterable[str], model: str) -> set[str]:
        """Hosts where any of `routes` holds a lease for `model` (the chooser's peers rule)."""
        return self._index.hosts_with_lease(routes, model)

    def note_candidates(self, route: str, hosts: Iterable[str]) -> None:
        """The config names these hosts for `route`: a pin to one of them is allowed even
        before any request of the route was seen."""
        self.memory.note_candidates(route, hosts)

    @property
    def journal(self) -> Journal:
        """Where the table's changes go: the store's state (degraded?) and unsaved leases."""
        return self._journal

    # -- acquire -----------------------------------------------------------------------------

    def peek(self, key: Key, candidates: Sequence[str], peers: Sequence[str] = ()) -> Acquired:
        """Where a request with `key` would go by the acquire rules, creating, moving and
        touching nothing: for calls that must not make a lease (a control call with no
        conversation, such as a web UI's GET /props). Raises PinnedDown or NoHost."""
        standing = self._standing(key, candidates, draining_too=True)
        if standing is not None:
            return standing
        return self._unleased(key, candidates, peers)

    def spare(self, key: Key, candidates: Sequence[str], home: str | None = None) -> Acquired:
        """Where a batch request with `key` goes, creating, moving and touching nothing (a
        batch request has no turn to keep warm, and must never move a conversation's lease):
        a pin as ever; the lease its key already has, when that host is healthy and not
        draining (a session's batch request runs warm beside its turns); else the usable
        host where its batch cap lets it start soonest, `home` (where its shared system
        prompt last went) first (chooser.py). Raises PinnedDown or NoHost."""
        standing = self._standing(key, candidates, draining_too=False)
        if standing is not None:
            return standing
        return self._unleased(key, candidates, (), batch=True, home=home)

    def _standing(self, key: Key, candidates: Sequence[str], draining_too: bool) -> Acquired | None:
        """For a request that makes no lease: the route's pin (PinnedDown when its host is
        down), else the host of the lease `key` or its route holds, when that is a healthy
        candidate (and not draining, unless `draining_too`); else None."""
        healthy, draining = self._hosts.healthy, self._hosts.draining
        pin = self.pinned(key.route)
        if pin is not None and pin in candidates:
            if not healthy(pin):
                raise PinnedDown(key.route, pin)
            return Acquired(pin, reused=True, pinned=True)
        for held in (self._index.get(key), self._index.get(Key(key.route, "", key.model))):
            if held is not None and held.host in candidates and healthy(held.host):
                if draining_too or not draining(held.host):
                    return Acquired(held.host, reused=True, pinned=False)
        return None

    def _unleased(
        self, key: Key, candidates: Sequence[str], peers: Sequence[str], batch: bool = False,
        home: str | None = None,
    ) -> Acquired:  # fmt: skip
        """The chooser's pick of the healthy, non-draining candidates, recording nothing."""
        healthy, draining = self._hosts.healthy, self._hosts.draining
        usable = [h for h in candidates if healthy(h) and not draining(h)]
        host = self._choose(usable, key.model, peers, batch=key.route if batch else None, home=home)
        if host is None:
            raise NoHost(key.route, key.model)
        return Acquired(host, reused=False, pinned=False)

    async def acquire(
        self,
        key: Key,
        candidates: Sequence[str],
        now: float,
        peers: Sequence[str] = (),
        need: int = 0,
        warm: str | None = None,
    ) -> Acquired:
        """The host for a request with lease key `key`; `candidates` are the route's hosts
        serving the model, in config order; `peers` the routes whose hosts a new lease
        prefers; `need` the tokens a new conversation is expected to keep warm; `warm` a host
        the conversation is known to be warm on with no lease of its own (its lease from
        before an upgrade changed its key), which a new lease takes in place of the chooser's
        pick when it is a healthy, non-draining candidate. Raises PinnedDown or NoHost."""
        if not key.model:
            raise ValueError("a lease key needs a model (fp == model == '' names a pin row)")
        candidates = tuple(candidates)
        # Not lease state: a record that the route listed these hosts, whatever comes next.
        self.memory.seen.setdefault(key.route, set()).update(candidates)
        if key not in self._locks:
            # A conversation's next turn, no write due: nothing else runs for the key, no lock.
            memory = self.memory
            reused = memory.reused_at_once(key, candidates, now, self._hosts, self._touch_every)
            if reused is not None:
                return reused
        return await self._locks.run(
            key, lambda: self._acquire(key, candidates, now, peers, need, warm)
        )

    async def move(
        self, key: Key, host: str, now: float, reason: str, origin: str | None = None
    ) -> bool:
        """Move `key`'s lease to `host` (a hand-off, the valve); False if gone, there, lost,
        or (with `origin`) no longer on `origin`."""

        async def moved() -> bool:
            lease = self._index.get(key)
            if lease is None or lease.host == host:
                return False
            if origin is not None and lease.host != origin:
                return False
            with suppress(_Lost):
                await self._place(key, host, now, reason, lease.host)
                return True
            return False

        return await self._locks.run(key, moved)

    async def rehome(
        self,
        key: Key,
        candidates: Sequence[str],
        now: float,
        peers: Sequence[str] = (),
        reason: str = "cold",
    ) -> Acquired | None:
        """Place `key`'s lease again as the chooser would place it new, its own weight on its
        host not counted: a conversation whose host evicted its prefix pays the prefill
        wherever its next turn goes, so that turn goes where it will stay warm. A move has
        event `reason`; None when the lease stays (also when there is none, the route is
        pinned, or its host is unhealthy: `acquire` then decides as ever)."""

        moved = await self._locks.run(
            key, lambda: self._choose_again(key, candidates, now, peers, reason, None)
        )
        return None if moved is None else Acquired(moved, reused=False, pinned=False)

    async def leave(
        self,
        key: Key,
        host: str,
        candidates: Sequence[str],
        now: float,
        peers: Sequence[str] = (),
        reason: str = "resumed",
    ) -> str | None:
        """Move `key`'s lease off `host` (whose answer to it was cut) to the chooser's pick
        among the other healthy, non-draining `candidates`, with event `reason`; the host it
        went to, or None when it stays (gone, elsewhere already, pinned, or nowhere to go)."""
        return await self._locks.run(
            key, lambda: self._choose_again(key, candidates, now, peers, reason, host)
        )

    async def _choose_again(
        self,
        key: Key,
        candidates: Sequence[str],
        now: float,
        peers: Sequence[str],
        reason: str,
        leaving: str | None,
    ) -> str | None:
        """`key`'s lease placed again by the chooser (its own weight not counted), under its
        lock: off `leaving` (only while it is there), or, with None, wherever it would go new
        (only from a healthy candidate host, and decided once: it is no longer cold). The host
        it went to; None when it stays, or is pinned."""
        healthy, draining = self._hosts.healthy, self._hosts.draining
        lease = self._index.get(key)
        if lease is None:
            return None
        if leaving is None and (lease.host not in candidates or not healthy(lease.host)):
            return None
        if leaving is not None and lease.host != leaving:
            return None
        pin = self.pinned(key.route)
        if pin is not None and pin in candidates:
            return None
        if leaving is None:
            lease.cold = False  # decided once, whatever comes of it
        usable = [h for h in candidates if h != leaving and healthy(h) and not draining(h)]
        host = self._choose(usable, key.model, peers, lease.turn_prompt, leaving=lease)
        if host is None or host == lease.host:
            return None
        with suppress(_Lost):
            await self._place(key, host, now, reason, lease.host)
            return host
        return None

    async def undo(self, key: Key, host: str, now: float) -> bool:
        """Forget a lease that its first request could not use (refused by crossbar after it
        was made, or by the host with a 4xx): a request nobody could serve places nothing.
        Only while it is still that lease: on `host`, never used since it was made. Event
        reason `refused`; True when it went."""

        async def undone() -> bool:
            lease = self._index.get(key)
            if lease is None or lease.host != host or lease.last_used != lease.created:
                return False
            await self._drop([lease], now, "refused", keep_ok=True)
            return True

        return await self._locks.run(key, undone)

    async def _acquire(
        self,
        key: Key,
        candidates: tuple[str, ...],
        now: float,
        peers: Sequence[str],
        need: int,
        warm: str | None,
    ) -> Acquired:
        # Another instance sharing the store may write the key between our decision and our
        # write; the write then fails, its row is taken into memory, and we decide again.
        for _ in range(_RETRIES):
            try:
                return await self._decide(key, candidates, now, peers, need, warm)
            except _Lost:
                continue
        return await self._decide(key, candidates, now, peers, need, warm)

    async def _decide(
        self,
        key: Key,
        candidates: tuple[str, ...],
        now: float,
        peers: Sequence[str],
        need: int = 0,
        warm: str | None = None,
    ) -> Acquired:
        healthy, draining = self._hosts.healthy, self._hosts.draining
        lease = self._index.get(key)
        pin = self.pinned(key.route)
        # 1. A pin outranks everything, health included. (A pin host that does not serve this
        # model is not among the candidates; such requests go the ordinary way.)
        if pin is not None and pin in candidates:
            if not healthy(pin):
                raise PinnedDown(key.route, pin)
            if lease is not None and lease.host == pin:
                await self._touch(lease, now)
                return Acquired(pin, reused=True, pinned=True)
            # A lease elsewhere is one the pin's deletion raced with: it moves to the pin.
            reason, origin = ("pin", lease.host) if lease is not None else ("new", "")
            await self._place(key, pin, now, reason, origin)
            return Acquired(pin, reused=False, pinned=True, born=not origin)
        # 2. An existing lease on a healthy host decides (draining hosts keep their leases).
        origin, reason = "", "new"
        if lease is not None:
            if lease.host in candidates and healthy(lease.host):
                await self._touch(lease, now)
                return Acquired(lease.host, reused=True, pinned=False)
            # Unhealthy, or no longer a host of the route (config changed): the lease moves.
            origin = lease.host
            reason = "unhealthy" if not healthy(lease.host) else "config"
        # 3. A conversation inherits the route's own lease for the model.
        if key.fp:
            parent = self._index.get(Key(key.route, "", key.model))
            if (
                parent is not None
                and parent.host in candidates
                and healthy(parent.host)
                and not draining(parent.host)
            ):
                await self._place(key, parent.host, now, reason, origin)
                return Acquired(parent.host, reused=True, pinned=False, born=not origin)
        # 4. Choose among healthy, non-draining candidates (the host a lease leaves is neither
        # healthy nor a candidate); none: nothing changes. A new lease whose conversation is
        # known warm on one of them goes there.
        usable = [h for h in candidates if healthy(h) and not draining(h)]
        if lease is None and warm in usable:
            host: str | None = warm
        else:
            host = self._choose(usable, key.model, peers, need)
        if host is None:
            raise NoHost(key.route, key.model)
        await self._place(key, host, now, reason, origin)
        return Acquired(host, reused=False, pinned=False, born=not origin)

    def _choose(
        self,
        usable: list[str],
        model: str,
        peers: Sequence[str],
        need: int = 0,
        leaving: Lease | None = None,
        batch: str | None = None,
        home: str | None = None,
    ) -> str | None:
        if not usable:
            return None
        index, placing = self._index, self._placing
        return self._chooser.choose(
            usable,
            model,
            leases=lambda host: index.count(host, model) + placing[(host, model)],
            peers=index.hosts_with_lease(peers, model) if peers else (),
            need=need,
            leaving=leaving,
            batch=batch,
            home=home,
        )

    def placing(self, host: str, model: str) -> int:
        """Leases chosen for (host, model) whose writes have not landed yet."""
        return self._placing[(host, model)]

    def placing_on(self, host: str) -> set[str]:
        """The models of the leases chosen for `host` whose writes have not landed yet."""
        return {m for (h, m), n in self._placing.items() if h == host and n}

    async def _place(self, key: Key, host: str, now: float, reason: str, origin: str) -> None:
        """Make or move `key`'s lease, if the store still has it where we think (`origin`).

        The lease counts for `host` from this call on (before any await), so a choice made
        meanwhile for another key sees it."""
        lease = Lease(key, host, State.ACTIVE, created=now, last_used=now, moved=bool(origin))
        event = LeaseEvent(now, key.route, key.fp, key.model, origin, host, reason)
        change = Change(save=[lease], events=[event], expect=(key, origin))
        placing = (host, key.model)
        self._placing[placing] += 1
        try:
            await self._commit(change, keep_ok=True)
        finally:
            self._placing[placing] -= 1
            if not self._placing[placing]:
                del self._placing[placing]

    async def _touch(self, lease: Lease, now: float) -> None:
        if now - self.memory.saved_use(lease.key) > self._touch_every:
            touched = evolve(lease, last_used=max(lease.last_used, now))
            change = Change(save=[touched], expect=(lease.key, lease.host))
            await self._commit(change, keep_ok=True)
        else:
            lease.last_used = max(lease.last_used, now)

    # -- operator and sweep ------------------------------------------------------------------

    async def expire_idle(self, now: float, batch: int = 0) -> int:
        """Drop leases unused for longer than `idle` (pins never expire); returns how many.
        At most `batch` (0: all) per transaction, the reactor free between (expiry.py)."""
        expired, before = 0, now - self._idle
        pause = lambda: deferLater(self._journal.clock, 0)  # noqa: E731
        scan = list(self._index.all())
        async for idle in idle_batches(scan, before, batch, self._index.get, pause):
            written = await self._drop(idle, now, "idle", idle_before=before)
            expired += len(idle) - len(written.kept)
        return expired

    async def pin(self, route: str, host: str, now: float) -> None:
        """Send every request of `route` to `host`; the route's leases elsewhere are deleted.

        Raises UnknownHost unless `host` was a candidate of the route (or held one of its
        leases when the table was loaded)."""
        if host not in self.memory.seen.get(route, ()):
            raise UnknownHost(route, host)
        previous = self.pinned(route)
        movers = [lease for lease in self._index.of_route(route) if lease.host != host]
        if previous == host and not movers:
            return
        events = [
            LeaseEvent(now, route, lease.key.fp, lease.key.model, lease.host, host, "pin")
            for lease in movers
        ]
        if previous != host:
            events.insert(0, LeaseEvent(now, route, "", "", previous or "", host, "pin"))
        row = Lease(pin_key(route), host, State.PINNED, created=now, last_used=now)
        change = Change(save=[row], delete=[lease.key for lease in movers], events=events)
        await self._commit(change, keep_ok=False, durable=True)

    async def reconfigure(self, config: Config) -> int:
        """Take a reloaded config: its `lease_idle` from now on, and hosts it no longer has
        forgotten (their leases and pins dropped, reason "config"). Returns the number of
        leases dropped."""
        now = self._journal.clock.seconds()
        self._idle = config.server.lease_idle
        self._touch_every = min(60.0, self._idle / 100)
        pins = self.memory.pin_rows()
        held = {lease.host for lease in self._index.all()} | {p.host for p in pins}
        gone = held - set(config.hosts)
        for hosts in self.memory.seen.values():
            hosts.intersection_update(config.hosts)
        return await self.drop_hosts(gone, now) if gone else 0

    async def unpin(self, route: str, now: float) -> None:
        """Remove the route's pin; its leases stay where they are."""
        host = self.pinned(route)
        if host is None:
            return
        event = LeaseEvent(now, route, "", "", host, "", "release")
        await self._commit(Change(delete=[pin_key(route)], events=[event]), durable=True)

    async def release(self, route: str, now: float) -> int:
        """Drop every lease of `route` (not its pin); returns how many."""
        leases = list(self._index.of_route(route))
        await self._drop(leases, now, "release", durable=True)
        return len(leases)

    async def drop_hosts(self, names: set[str], now: float) -> int:
        """Forget hosts the config no longer has: drop their leases and pins (reason "config").

        Returns the number of leases dropped, pins not included."""
        leases = [lease for lease in self._index.all() if lease.host in names]
        pins = [pin for pin in self.memory.pin_rows() if pin.host in names]
        await self._drop(leases, now, "config", pins=pins, keep_ok=True)
        for hosts in self.memory.seen.values():
            hosts.difference_update(names)
        return len(leases)

    async def _drop(
        self,
        leases: list[Lease],
        now: float,
        reason: str,
        pins: Sequence[Lease] = (),
        keep_ok: bool = False,
        durable: bool = False,
        idle_before: float | None = None,
    ) -> Written:
        """Delete leases (and pin rows), one `reason` event each. With `idle_before` only
        those the store has not seen used since (another instance may have)."""
        gone = [*pins, *leases]
        if not gone:
            return Written()
        events = [
            LeaseEvent(now, x.key.route, x.key.fp, x.key.model, x.host, "", reason) for x in gone
        ]
        change = Change(delete=[x.key for x in gone], events=events, idle_before=idle_before)
        return await self._commit(change, keep_ok=keep_ok, durable=durable)

    # -- writing -----------------------------------------------------------------------------

    async def _commit(
        self, change: Change, keep_ok: bool = False, durable: bool = False
    ) -> Written:
        """Write a change, then apply it to memory. With `keep_ok` a change the store cannot
        take now is applied all the same and kept by the journal; otherwise a failed write
        raises StoreUnavailable and changes nothing. `durable`: an operator's change, made
        durable before it is acknowledged. A conditional change another instance beat takes
        the store's row into memory and raises _Lost.

        Memory is updated from the write's own callback, so a caller cancelled mid-write (a
        client gone) still leaves memory agreeing with the store; the caller waits for the
        write to land before it gives up its key lock."""
        write = self._journal.submit(change, keep_ok=keep_ok, durable=durable)
        write.addCallback(self._applied, change)
        try:
            return await shielded(write)
        except CancelledError:
            await shielded(write)
            raise

    def _landed_late(self, change: Change, written: Written) -> None:
        # An operator's change refused at the store's deadline that the store took after all.
        with suppress(_Lost):
            self._applied(written, change)

    def _applied(self, written: Written, change: Change) -> Written:
        if not written.applied:
            assert change.expect is not None
            self.memory.adopt(change.expect[0], written.current, written.change_id)
            raise _Lost()
        kept = written.kept
        self.memory.applied(change, written)
        for event in change.events:
            if kept and Key(event.route, event.fp, event.model) in kept:
                continue
            for listener in list(self.listeners):
                try:
                    listener(event)
                except Exception:
                    _log.failure("lease listener failed on {event}", event=event)
        return written
