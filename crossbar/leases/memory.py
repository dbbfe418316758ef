"""The lease table's memory: leases and pins as this instance knows them, read in O(1), and
brought up to date with what other instances sharing the store wrote.

`Table` (table.py) makes the changes, writes them and holds one of these for their result:
it applies what it wrote (`applied`); the follower (cluster/follower.py) applies what other
instances wrote (`apply_remote`). A change read from the change log is applied unless this
instance wrote the same key since (its own write is newer): each of our writes is remembered by
its change number until the log has been read past it.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from attrs import evolve

from crossbar.leases.index import LeaseIndex
from crossbar.leases.types import Acquired, Change, HostStates, Key, Lease, State, Written


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a table's leases are made, and the objects made so
    far kept out of later collections: a million leases are millions of objects no cycle
    holds, and each collection of the oldest generation would walk them all (about a third
    of loading a million leases, and a pause on every full collection afterwards)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


class LeaseMemory:
    """Leases by key with their indexes, pins by route, and the routes' candidate hosts."""

    def __init__(self) -> None:
        self.index = LeaseIndex()  # the leases: read them, change them only through here
        self._saved_use: dict[Key, float] = {}  # last_used as last written
        self._pins: dict[str, Lease] = {}
        self.seen: dict[str, set[str]] = {}  # route -> hosts ever its candidates
        self._own: dict[Key, int] = {}  # keys we wrote, by change number, until the log passes
        self._own_order: deque[tuple[int, Key]] = deque()

    def pinned(self, route: str) -> str | None:
        pin = self._pins.get(route)
        return pin.host if pin else None

    def pins(self) -> dict[str, str]:
        """route -> pinned host."""
        return {route: pin.host for route, pin in self._pins.items()}

    def snapshot(self, route: str | None = None) -> list[Lease]:
        """Copies of the leases (of `route`, or all), sorted by route, fp, model; pins excluded."""
        leases = self.index.of_route(route) if route is not None else self.index.all()
        return sorted(
            (evolve(lease) for lease in leases),
            key=lambda lease: (lease.key.route, lease.key.fp, lease.key.model),
        )

    def reused_at_once(
        self,
        key: Key,
        candidates: tuple[str, ...],
        now: float,
        hosts: HostStates,
        touch_every: float,
    ) -> Acquired | None:
        """The acquire rules 1 and 2 (Table._decide) where they decide with no write: the
        key's lease is on the pinned host, or (no pin among the candidates) on a healthy
        candidate, and its last_used needs no saving yet. Its in-memory last_used advances.
        None: anything else, for the full decision."""
        lease = self.index.get(key)
        if lease is None or now - self._saved_use[key] > touch_every:
            return None
        host, pin = lease.host, self.pinned(key.route)
        pinned = pin is not None and pin in candidates
        if pinned and host != pin:
            return None
        if not hosts.healthy(host) or (not pinned and host not in candidates):
            return None
        lease.last_used = max(lease.last_used, now)
        return Acquired(host, reused=True, pinned=pinned)

    def saved_use(self, key: Key) -> float:
        """`key`'s last_used as last written to the store."""
        return self._saved_use[key]

    def pin_rows(self) -> list[Lease]:
        """The pin rows held (not copies)."""
        return list(self._pins.values())

    def applied(self, change: Change, written: Written) -> None:
        """Our own `change`, as the store took it: its deletes (but an expiry's leases used
        since elsewhere) and saves, remembered as ours by their change number."""
        kept = written.kept
        self._forget_all([k for k in change.delete if k not in kept] if kept else change.delete)
        for lease in change.save:
            self._remember(lease)
        self._mark_own(change, written.change_id)

    def note_candidates(self, route: str, hosts: Iterable[str]) -> None:
        """The config names these hosts for `route`: a pin to one of them is allowed even
        before any request of the route was seen."""
        self.seen.setdefault(route, set()).update(hosts)

    def _mark_own(self, change: Change, change_id: int) -> None:
        """Our own write numbered `change_id`: an older row of another instance for the same
        keys, read later from the change log, must not undo it."""
        if not change_id:
            return
        for key in [*change.delete, *(x.key for x in change.save)]:
            self._own[key] = change_id
            self._own_order.append((change_id, key))

    def apply_remote(self, lease: Lease | None, key: Key, change_id: int) -> None:
        """Another instance wrote `key` (`lease`, or None: deleted) as change `change_id`."""
        if self._own.get(key, 0) > change_id:
            return  # we wrote the key since: ours is newer
        self.adopt(key, lease, change_id)

    def caught_up(self, change_id: int) -> None:
        """The change log has been read up to `change_id`: our own writes up to there need no
        more guarding."""
        order = self._own_order
        while order and order[0][0] <= change_id:
            number, key = order.popleft()
            if self._own.get(key) == number:
                del self._own[key]

    def replace_all(self, leases: Iterable[Lease]) -> None:
        """Forget everything and hold `leases` (the store's rows) instead."""
        self.index.clear()
        self._saved_use.clear()
        self._pins.clear()
        self._own.clear()
        self._own_order.clear()
        for lease in leases:
            self._remember(lease)
            self.seen.setdefault(lease.key.route, set()).add(lease.host)

    def load(self, leases: list[Lease]) -> None:
        """Hold the store's rows in an empty memory, in bulk (a million at a restart); the
        objects are fresh, so they are kept as they are."""
        index: list[Lease] = []
        for lease in leases:
            key = lease.key
            if key.fp == "" and key.model == "" and lease.state is State.PINNED:
                self._pins[key.route] = lease
            else:
                index.append(lease)
        self.index.fill(index)
        self._saved_use = {lease.key: lease.last_used for lease in index}
        for route, host in {(lease.key.route, lease.host) for lease in leases}:
            self.seen.setdefault(route, set()).add(host)

    def adopt(self, key: Key, lease: Lease | None, change_id: int) -> None:
        """The store's row for `key` (None: none), written by another instance. A lease that
        came from another host than the one held here moved (the valve's hold reads it)."""
        if lease is None:
            self._forget(key)
            return
        held = self.index.get(key)
        self._remember(lease)
        adopted = self.index.get(key)
        if adopted is None:
            return  # a pin row
        adopted.remote = True
        if held is not None and (held.host != lease.host or held.moved):
            adopted.moved = held.host != lease.host or held.created == lease.created

    def _remember(self, lease: Lease, copy: bool = True) -> None:
        if copy:
            lease = evolve(lease)  # never share an object with the caller or the store
        key = lease.key
        if key.fp == "" and key.model == "" and lease.state is State.PINNED:
            self._pins[key.route] = lease
        else:
            self.index.put(lease)
            self._saved_use[key] = lease.last_used

    def _forget(self, key: Key) -> None:
        if not key.fp and not key.model:  # a pin row (pin_key), told without making a Key
            self._pins.pop(key.route, None)
        self.index.drop(key)
        self._saved_use.pop(key, None)

    def _forget_all(self, keys: Iterable[Key]) -> None:
        """`_forget` each of `keys`: a sweep's batch of hundreds, on the reactor thread."""
        pins, drop, saved_use = self._pins, self.index.drop, self._saved_use
        for key in keys:
            if not key.fp and not key.model:
                pins.pop(key.route, None)
            drop(key)
            saved_use.pop(key, None)
