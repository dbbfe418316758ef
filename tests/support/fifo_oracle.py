"""The limiter as it was before routes shared it (a verbatim copy of crossbar/limiter.py at
d339e6f but for the class name): one FIFO per (host, model). The oracle of the property test that
the fair limiter, with every route at the defaults, behaves exactly like it."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from attrs import define, field, frozen
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from crossbar.config.values import Config

Release = Callable[[], None]
Pair = tuple[str, str]  # (host, model)

# How long a slot is held, until one has been seen: a longish generation. Not queue_timeout:
# right after a restart that would send every refused client away for minutes.
FIRST_HOLD_GUESS = 30.0
# Weight of the newest hold time in the running average behind retry-after hints.
_HOLD_WEIGHT = 0.2


class LimiterError(Exception):
    """The limiter refused a request; `retry_after` is a hint in seconds for the client."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QueueFull(LimiterError):
    """Refused at once: no free slot and the queue already holds `queue_max` waiters."""


class QueueTimeout(LimiterError):
    """Waited `queue_timeout` in the queue without getting a slot."""


@frozen
class SlotState:
    """One (host, model) as the admin API and metrics see it. Counters only grow."""

    host: str
    model: str
    parallel: int
    in_flight: int  # acquired and tracked requests
    tracked: int  # of in_flight, requests counted by `track`
    queued: int
    free: int
    admitted: int  # slots granted by `acquire`, at once or after waiting
    tracked_total: int
    refused: int  # QueueFull
    timed_out: int  # QueueTimeout
    cancelled: int  # waiters that left the queue (client gone)
    wait_seconds: float  # total time admitted requests spent queued
    stopped: int = 0  # batch requests stopped for a turn: the old FIFO had no classes


@define(eq=False)
class _Waiter:
    enqueued: float
    deferred: Deferred[Release] | None = None
    timer: IDelayedCall | None = None


@define
class _Slots:
    held: int = 0
    tracked: int = 0
    waiters: deque[_Waiter] = field(factory=deque)
    hold_average: float | None = None
    admitted: int = 0
    tracked_total: int = 0
    refused: int = 0
    timed_out: int = 0
    cancelled: int = 0
    wait_seconds: float = 0.0

    @property
    def in_flight(self) -> int:
        return self.held + self.tracked


class FifoLimiter:
    """Slots and queues for every (host, model); time comes from the injected `clock`.

    Entries are created on first use and kept (so counters stay monotonic for metrics); they are
    bounded by the configured (host, model) pairs the proxy asks about.
    """

    def __init__(
        self,
        clock: IReactorTime,
        parallel: Callable[[str, str], int],
        queue_max: int,
        queue_timeout: float,
    ) -> None:
        self._clock = clock
        self._parallel = parallel
        self._queue_max = queue_max
        self._queue_timeout = queue_timeout
        self._slots: dict[Pair, _Slots] = {}

    # -- the request path

    def acquire(self, host: str, model: str) -> Deferred[Release]:
        """A slot: fires with its idempotent release, or fails with QueueFull / QueueTimeout.

        Cancelling the Deferred while it waits removes the waiter from the queue; it never holds a
        slot. Once it has fired, the caller owns the release and must call it.
        """
        key = (host, model)
        slots = self._entry(key)
        self._admit(key, slots)  # parallel may have grown without a `resized` call
        if not slots.waiters and slots.in_flight < self._limit(key):
            slots.held += 1
            slots.admitted += 1
            return succeed(self._release(key, slots, tracked=False))
        if len(slots.waiters) >= self._queue_max:
            slots.refused += 1
            retry = self._retry_after(key, slots)
            return fail(QueueFull(f"queue for {model} on {host} is full", retry))
        waiter = _Waiter(enqueued=self._clock.seconds())
        waiter.deferred = Deferred(lambda _: self._leave(slots, waiter))
        waiter.timer = self._clock.callLater(self._queue_timeout, self._expire, key, slots, waiter)
        slots.waiters.append(waiter)
        return waiter.deferred

    def track(self, host: str, model: str) -> Release:
        """Count a request without waiting or refusing (in flight may exceed parallel)."""
        key = (host, model)
        slots = self._entry(key)
        slots.tracked += 1
        slots.tracked_total += 1
        return self._release(key, slots, tracked=True)

    # -- reload and discovery

    def reconfigure(self, config: Config) -> None:
        """New queue limits (config reload). Waiters already queued keep their place and deadline;
        a smaller `queue_max` refuses newcomers until the queue is below it."""
        self._queue_max = config.server.queue_max
        self._queue_timeout = config.server.queue_timeout

    def resized(self, host: str, model: str) -> None:
        """`parallel(host, model)` changed: admit waiters into slots that are now free.

        A shrink revokes nothing: holders keep their slots, and waiters are admitted again only
        once in flight has fallen below the new parallel.
        """
        key = (host, model)
        slots = self._slots.get(key)
        if slots is not None:
            self._admit(key, slots)

    # -- views

    def parallel(self, host: str, model: str) -> int:
        """Slots of (host, model) as configured or discovered (0 or less: not known)."""
        return self._parallel(host, model)

    def in_flight(self, host: str, model: str) -> int:
        slots = self._slots.get((host, model))
        return 0 if slots is None else slots.in_flight

    def free_slots(self, host: str, model: str) -> int:
        return max(0, self._limit((host, model)) - self.in_flight(host, model))

    def queued(self, host: str, model: str) -> int:
        slots = self._slots.get((host, model))
        return 0 if slots is None else len(slots.waiters)

    def batch_room(self, host: str, model: str, route: str = "") -> int:
        return self.free_slots(host, model) - self.queued(host, model)

    def snapshot(self) -> list[SlotState]:
        """Every (host, model) seen so far, sorted by host then model."""
        states = []
        for key in sorted(self._slots):
            s = self._slots[key]
            parallel = self._limit(key)
            states.append(
                SlotState(
                    host=key[0],
                    model=key[1],
                    parallel=parallel,
                    in_flight=s.in_flight,
                    tracked=s.tracked,
                    queued=len(s.waiters),
                    free=max(0, parallel - s.in_flight),
                    admitted=s.admitted,
                    tracked_total=s.tracked_total,
                    refused=s.refused,
                    timed_out=s.timed_out,
                    cancelled=s.cancelled,
                    wait_seconds=s.wait_seconds,
                )
            )
        return states

    # -- internals

    def _entry(self, key: Pair) -> _Slots:
        slots = self._slots.get(key)
        if slots is None:
            slots = self._slots[key] = _Slots()
        return slots

    def _limit(self, key: Pair) -> int:
        # A parallel below 1 would strand every waiter until its timeout.
        return max(1, self._parallel(*key))

    def _release(self, key: Pair, slots: _Slots, tracked: bool) -> Release:
        started = self._clock.seconds()
        done = False

        def release() -> None:
            nonlocal done
            if done:
                return
            done = True
            if tracked:
                slots.tracked -= 1
            else:
                slots.held -= 1
            held_for = self._clock.seconds() - started
            average = slots.hold_average
            slots.hold_average = (
                held_for if average is None else average + _HOLD_WEIGHT * (held_for - average)
            )
            # The release rule: in flight was <= parallel before the decrement exactly when it
            # is < parallel now, and only then does a waiter get the slot.
            self._admit(key, slots)

        return release

    def _admit(self, key: Pair, slots: _Slots) -> None:
        while slots.waiters and slots.in_flight < self._limit(key):
            waiter = slots.waiters.popleft()
            assert waiter.timer is not None and waiter.deferred is not None
            waiter.timer.cancel()
            slots.held += 1
            slots.admitted += 1
            slots.wait_seconds += self._clock.seconds() - waiter.enqueued
            # State is settled before the callback: it may re-enter (release, acquire).
            waiter.deferred.callback(self._release(key, slots, tracked=False))

    def _leave(self, slots: _Slots, waiter: _Waiter) -> None:
        # The Deferred canceller: only runs while the waiter is still queued (a fired Deferred
        # ignores cancel), and Deferred.cancel then errbacks it with CancelledError.
        slots.waiters.remove(waiter)
        slots.cancelled += 1
        assert waiter.timer is not None
        waiter.timer.cancel()

    def _expire(self, key: Pair, slots: _Slots, waiter: _Waiter) -> None:
        slots.waiters.remove(waiter)
        slots.timed_out += 1
        assert waiter.deferred is not None
        host, model = key
        waited = self._clock.seconds() - waiter.enqueued
        waiter.deferred.errback(
            QueueTimeout(
                f"waited {waited:g}s for a slot for {model} on {host}",
                self._retry_after(key, slots),
            )
        )

    def _retry_after(self, key: Pair, slots: _Slots) -> float:
        hold = FIRST_HOLD_GUESS if slots.hold_average is None else slots.hold_average
        estimate = hold * (len(slots.waiters) + 1) / self._limit(key)
        # Retry-After is whole seconds; below 1 s a client would just hammer the queue.
        return max(1.0, min(estimate, self._queue_timeout))
