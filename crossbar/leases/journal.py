"""Lease changes on their way to the store, and kept in memory while it cannot be written.

Every change the lease table makes goes through `Journal.submit`, which writes it at once (the
store keeps the order writes were submitted in). The table applies a change to memory only
when it is written or kept, so changes in flight at once never see each other's effects: a
write that fails and another that lands meanwhile cannot contradict each other.

When a write fails (a full disk, a read-only file, a database gone), crossbar degrades
visibly instead of failing requests: changes that serve clients (new leases, moves, touches,
hosts removed by a reload) are applied to memory and kept, the last state per lease plus the
events, to be written when the store recovers; operator changes (pins, unpins, releases,
drains) and the sweep's expiry are refused with StoreUnavailable, so nothing is acknowledged
and then lost, and nothing the operator does can reorder the kept changes. The store is tried
again with a growing backoff; the first write that lands ends the outage, with no restart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from attrs import define, field
from twisted.internet.defer import Deferred, ensureDeferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure

from crossbar.leases.types import Change, Key, Lease, Written
from crossbar.records import LeaseEvent

BACKOFF = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # seconds between tries while the store fails
# Beyond the store's own statement timeout: the database's own error normally comes first; the
# journal's deadline is for a store that gives no answer at all (a thread stuck on a socket).
DEADLINE_SLACK = 1.0
MAX_KEPT_EVENTS = 100_000  # history kept for an outage; past it the oldest go (counted)
_log = Logger(namespace="crossbar.store")


class StoreUnavailable(Exception):
    """The store cannot be written now: the change was not made."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"the store cannot be written now ({reason}); crossbar goes on routing from "
            "memory, and this change can be made once the store recovers"
        )
        self.reason = reason


class StoreTimeout(Exception):
    """The store gave no answer within the journal's deadline."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the store has not answered a write for {seconds:g}s")


class JournalStore(Protocol):
    """What the journal needs of crossbar.store.Store."""

    async def write(self, change: Change, durable: bool = False) -> Written: ...

    async def ping(self) -> None: ...


def _merge(changes: Iterable[Change]) -> tuple[dict[Key, Lease | None], list[LeaseEvent]]:
    """The last state per key (None: deleted) and every event, in order."""
    states: dict[Key, Lease | None] = {}
    events: list[LeaseEvent] = []
    for change in changes:
        for key in change.delete:
            states[key] = None
        for lease in change.save:
            states[lease.key] = lease
        events.extend(change.events)
    return states, events


@define
class Journal:
    """Writes the table's changes to `store` on `clock`; see the module's docstring."""

    store: JournalStore
    clock: IReactorTime
    listeners: list[Callable[[bool], None]] = field(factory=list)  # hear degraded/recovered
    # A write not answered within this many seconds degrades the store as a failed one would
    # (0: wait for it): a database that is alive but not answering must not hold requests.
    deadline: float = 0.0
    # Hear a change refused at the deadline that the store then took (the table applies it).
    landed_late: list[Callable[[Change, Written], None]] = field(factory=list)
    degraded: bool = False
    reason: str = ""  # why the store failed, while degraded
    since: float | None = None  # clock seconds the outage began
    dropped_events: int = 0  # kept events that did not fit MAX_KEPT_EVENTS
    _kept: dict[Key, Lease | None] = field(factory=dict)
    _kept_events: list[LeaseEvent] = field(factory=list)
    _tries: int = 0
    _retry: IDelayedCall | None = None
    _trying: bool = False  # a try is writing now

    # -- what the table calls

    def submit(self, change: Change, keep_ok: bool, durable: bool = False) -> Deferred[Written]:
        """Write `change`: fires with what the store did, or (only with `keep_ok`) with a
        plain Written when it was kept in memory for later; fails with StoreUnavailable
        otherwise. A kept change's condition (`expect`) is not checked: after an outage the
        last writer wins, and the other instances follow it through the change log."""
        if self.degraded:
            return self._refuse(change, keep_ok)
        write = ensureDeferred(self.store.write(change, durable))
        done: Deferred[Written] = Deferred()
        timer: IDelayedCall | None = None

        def written(result: object) -> None:
            if timer is not None and timer.active():
                timer.cancel()
            if done.called:
                # Past the deadline the change was kept (written again on recovery, to the
                # same effect) or refused: a refused one that landed after all is in the store,
                # so memory must follow it.
                if isinstance(result, Failure):
                    self._degrade(result.value)
                elif not keep_ok and isinstance(result, Written) and result.applied:
                    _log.warn("a change refused at the store's deadline was written after all")
                    for listener in list(self.landed_late):
                        listener(change, result)
                return
            if isinstance(result, Failure):
                self._degrade(result.value)
                self._refuse(change, keep_ok).chainDeferred(done)
            else:
                done.callback(result)

        def too_late() -> None:
            self._degrade(StoreTimeout(self.deadline))
            self._refuse(change, keep_ok).chainDeferred(done)

        if self.deadline > 0:
            timer = self.clock.callLater(self.deadline, too_late)
        write.addBoth(written)
        return done

    def unsaved(self, key: Key) -> bool:
        """True for a lease whose latest state is kept in memory, not yet in the store."""
        return key in self._kept

    def status(self) -> dict[str, Any]:
        """The store's state for /api/status."""
        return {
            "degraded": self.degraded,
            "reason": self.reason or None,
            "since": self.since,
            "unsaved_leases": len(self._kept),
            "unsaved_events": len(self._kept_events),
            "dropped_events": self.dropped_events,
            "next_try_in": (
                max(0.0, self._retry.getTime() - self.clock.seconds())
                if self._retry is not None and self._retry.active()
                else None
            ),
        }

    async def gate(self, write: Callable[[], Awaitable[None]]) -> None:
        """Run another operator write (a drain): refused while degraded, and a failure
        degrades the journal like a lease write's would."""
        if self.degraded:
            raise StoreUnavailable(self.reason)
        try:
            await write()
        except Exception as e:
            self._degrade(e)
            raise StoreUnavailable(self.reason) from e

    def report(self, error: BaseException) -> None:
        """Another write to the store (a usage row) failed: the store is degraded."""
        self._degrade(error)

    def stop(self) -> None:
        """No more tries (the service stops)."""
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None

    # -- writing

    def _apply(
        self, states: dict[Key, Lease | None], events: list[LeaseEvent], durable: bool
    ) -> Awaitable[Written]:
        saves = [lease for lease in states.values() if lease is not None]
        deletes = [key for key, lease in states.items() if lease is None]
        return self.store.write(Change(saves, deletes, events), durable=durable)

    def _refuse(self, change: Change, keep_ok: bool) -> Deferred[Written]:
        if keep_ok:
            self._keep([change])
            return succeed(Written())
        return fail(StoreUnavailable(self.reason))

    def _keep(self, changes: Iterable[Change]) -> None:
        states, events = _merge(changes)
        self._kept.update(states)
        self._kept_events.extend(events)
        excess = len(self._kept_events) - MAX_KEPT_EVENTS
        if excess > 0:
            del self._kept_events[:excess]
            self.dropped_events += excess

    # -- the outage

    def _degrade(self, error: BaseException) -> None:
        self.reason = str(error) or error.__class__.__name__
        if not self.degraded:
            self.degraded = True
            self.since = self.clock.seconds()
            self._tries = 0
            _log.error(
                "store degraded: {reason}; routing goes on from memory, operator changes are "
                "refused until it recovers",
                reason=self.reason,
            )
            self._tell(True)
        if self._retry is None and not self._trying:
            self._schedule()

    def _schedule(self) -> None:
        delay = BACKOFF[min(self._tries, len(BACKOFF) - 1)]
        self._tries += 1
        self._retry = self.clock.callLater(delay, self._try_again)

    def _try_again(self) -> None:
        self._retry = None
        self._trying = True
        states, events = dict(self._kept), list(self._kept_events)
        d = ensureDeferred(self._flush(states, events))
        d.addErrback(lambda f: self._still_failing(f.value))

    async def _flush(self, states: dict[Key, Lease | None], events: list[LeaseEvent]) -> None:
        if states or events:
            await self._apply(states, events, durable=True)
        else:
            await self.store.ping()  # nothing kept: is the store writable again?
        self._trying = False
        for key, lease in states.items():
            if self._kept.get(key, lease) is lease:  # unchanged since the snapshot
                self._kept.pop(key, None)
        del self._kept_events[: len(events)]
        if self._kept or self._kept_events:
            self._schedule_now()
            return
        self._recover()

    def _schedule_now(self) -> None:
        # More was kept while the flush ran: write it next, without waiting a backoff.
        self._retry = self.clock.callLater(0, self._try_again)

    def _still_failing(self, error: BaseException) -> None:
        self._trying = False
        self.reason = str(error) or error.__class__.__name__
        if self._retry is None:
            self._schedule()

    def _recover(self) -> None:
        began = self.since
        self.degraded, self.reason, self.since = False, "", None
        self._tries = 0
        _log.info(
            "store recovered after {seconds:.0f}s; every change kept meanwhile is written",
            seconds=self.clock.seconds() - (began or self.clock.seconds()),
        )
        self._tell(False)

    def _tell(self, degraded: bool) -> None:
        for listener in list(self.listeners):
            try:
                listener(degraded)
            except Exception:
                _log.failure("store state listener failed")


def shielded(d: Deferred[Any]) -> Deferred[Any]:
    """A Deferred with `d`'s result; cancelling it leaves `d` (a store write) running."""
    out: Deferred[Any] = Deferred()

    def relay(result: object) -> None:
        if out.called:  # `out` was cancelled: nobody waits for this result any more
            if isinstance(result, Failure):
                _log.failure("lease write failed; its caller had gone", result, LogLevel.error)
        elif isinstance(result, Failure):
            out.errback(result)
        else:
            out.callback(result)

    d.addBoth(relay)
    return out
