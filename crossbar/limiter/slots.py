"""Per-(host, model) request slots with a bounded, fairly shared queue (docs/reference.md, "Slots").

Each (host, model) has `parallel` slots, read from a callable every time it matters so that
discovery and config reloads take effect without telling the limiter anything but `resized`.
`acquire` takes a slot or waits for one in a queue of at most `queue_max`, for at most
`queue_timeout`; `track` counts a request that must never wait (routes with `queue = false`).

Each request may name its route's limits (`RouteLimits`): the queue behind every (host, model)
is a `FairQueue` (priority, then fair share by weight, then arrival), a route's requests in
flight over all hosts stay within its `max_in_flight`, and its waiters per (host, model) within
its `max_queued`. With every route at the defaults the queue is the old FIFO exactly. When the
limiter has a config, the config's limits for a route win over what a caller passes, so a
request understood before a reload still queues under the new limits.

The release rule (seeds/v2.3-02): a release hands its slot to the first waiter only when in flight
<= parallel at that moment; otherwise it only decrements in flight. Implemented as "after the
decrement, admit waiters while in flight < parallel", which is the same condition and, with
`acquire` alone (in flight never above parallel), exactly a FIFO semaphore. "First waiter" is
the first in priority-then-fair order whose route is below its cap; and a release that takes a
capped route below its cap also lets that route's waiters on other (host, model)s into their
free slots. So no waiter is left while its slot is free and its route below its cap.

On a router-mode host that holds fewer models at once than are asked of it, a waiter is
admitted only for a model the swap gate (swaps.py) lets run there: the loaded models' turns go
before a load, within the host's `swap_after`.

Retry-after hints (for `Retry-After`): the expected wait of a request joining the back of the
queue now, `mean hold time x (queued + 1) / parallel`, where the mean is an exponentially
weighted average of how long recent requests held their slot (before any has finished, a
guess of FIRST_HOLD_GUESS seconds); at most `queue_timeout` and at least 1 s.

The expected wait (`expected_wait`, for the valve and the admin API): each request may bring
its `Work` (the tokens its host must prefill, the tokens it should write); what runs and the
waiters ahead, played forward on the slots at the host's pace (forecast.py), give the time
until a slot frees for one more; on a router-mode host the swap gate's wait comes first.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import count

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IReactorTime

from crossbar.config import DEFAULT_LIMITS, RANK, Config, RouteLimits
from crossbar.limiter.fairqueue import FairQueue
from crossbar.limiter.forecast import all_done, cost, first_free
from crossbar.limiter.rates import Rates
from crossbar.limiter.reserve import (
    BATCH_RANK,
    STANDARD_RANK,
    age,
    batch_cap,
    note_turns,
    to_stop,
    wake_at,
    yield_at,
)
from crossbar.limiter.swaps import Demand, Places, SwapGate
from crossbar.limiter.types import (
    LimiterError,
    Pair,
    QueueFull,
    QueueTimeout,
    Release,
    RouteEntry,
    RouteQueueFull,
    RouteState,
    SlotEntry,
    SlotState,
    Waiter,
    Work,
)

__all__ = [
    "FIRST_HOLD_GUESS",
    "Limiter",
    "LimiterError",
    "QueueFull",
    "QueueTimeout",
    "Rates",
    "Release",
    "RouteQueueFull",
    "RouteState",
    "SlotState",
    "Work",
]

# How long a slot is held, until one has been seen: a longish generation. Not queue_timeout:
# right after a restart that would send every refused client away for minutes.
FIRST_HOLD_GUESS = 30.0
# Weight of the newest hold time in the running average behind retry-after hints.
_HOLD_WEIGHT = 0.2
CLASS_AGING = 30.0  # server.class_aging's default, for a limiter made without a config


class Limiter:
    """Slots and queues for every (host, model); time comes from the injected `clock`.

    Entries per (host, model) are created on first use and kept (so counters stay monotonic for
    metrics); they are bounded by the configured (host, model) pairs the proxy asks about.
    Entries per route live while the route has requests in flight or waiting.
    """

    def __init__(
        self,
        clock: IReactorTime,
        parallel: Callable[[str, str], int],
        queue_max: int,
        queue_timeout: float,
        config: Config | None = None,
        rates: Rates | None = None,
        places: Places | None = None,
    ) -> None:
        """`places`: how many models each host holds at once, and which it runs (router-mode
        hosts: the swap gate); None: every model may always run."""
        self._clock = clock
        self.rates = rates if rates is not None else Rates()
        self._parallel = parallel
        self._queue_max = queue_max
        self._queue_timeout = queue_timeout
        self._config = config
        self._aging = config.server.class_aging if config is not None else CLASS_AGING
        self._slots: dict[Pair, SlotEntry] = {}
        self._routes: dict[str, RouteEntry] = {}
        self._arrivals = count()
        self._firsts = count(1)  # stopped batch requests' places, before every arrival
        # Told (host, model, priority) of each request that had to queue: a prewarm holding a
        # slot there gives it up (handoff/prewarm.py), so a client never waits behind one.
        self.on_wait: list[Callable[[str, str, int], None]] = []
        # Told (host, model) whenever its slots or queue moved (a release, a waiter gone): the
        # valve judges again the turns waiting elsewhere (proxy/valve.py).
        self.on_moved: list[Callable[[str, str], None]] = []
        self._waiting: dict[Work, Waiter] = {}  # the waiter of each queued work
        self._models: dict[str, set[str]] = {}  # host -> the models it has entries for
        self.gate: SwapGate | None = None
        if places is not None:
            self.gate = SwapGate(
                clock, places, self._demand, self._models_on, self.wake, self.rates.load
            )

    # -- the request path

    def acquire(
        self,
        host: str,
        model: str,
        route: RouteLimits | None = None,
        tenant: tuple[str, float] | None = None,
        work: Work | None = None,
        since: float | None = None,
        klass: int = STANDARD_RANK,
        first: bool = False,
    ) -> Deferred[Release]:
        """A slot: fires with its idempotent release, or fails with QueueFull / QueueTimeout.

        `route` places the request in the queue (None: an anonymous route at the defaults);
        `tenant` (a client key's name and weight) shares the route's turn with its other keys;
        `work` is what it asks of the slot (the expected wait); `since` when it began waiting
        elsewhere (a turn the valve moved keeps its deadline); `klass` its request class's rank
        (config/classes.py: batch 0, standard 1, interactive 2); `first`: queue before every
        waiter that came (a batch request stopped for a turn, going again). Cancelling the
        Deferred while it waits removes the waiter from the queue; it never holds a slot. Once
        it has fired, the caller owns the release and must call it.
        """
        key = (host, model)
        slots = self._entry(key)
        self._admit(key, slots)  # parallel may have grown without a `resized` call
        state = self._route(route)
        gate = self.gate
        if (
            slots.in_flight < self._limit(key)
            and state.below_cap()
            and (klass != BATCH_RANK or self._batch_room(key, slots, state.limits, klass))
            and (gate is None or gate.admits(host, model))
        ):
            # Whoever still waits here after _admit is at its route's cap or batch at its own:
            # nobody is passed over.
            if gate is not None:
                gate.enter(host, model)
            slots.held += 1
            slots.admitted += 1
            slots.by_class[klass] += 1
            note_turns(slots, klass, self._clock.seconds())
            state.held += 1
            state.by_class[klass] += 1
            self._start(key, slots, work)
            return succeed(self._release(key, slots, state, False, work, klass))
        name, bound = state.name, state.limits.queued_bound(self._queue_max)
        if len(slots.waiters) >= self._queue_max or slots.waiters.count(name) >= bound:
            slots.refused += 1
            self._forget_if_idle(state)
            retry = self._retry_after(key, slots)
            if len(slots.waiters) >= self._queue_max:
                return fail(QueueFull(f"queue for {model} on {host} is full", retry))
            message = f"route {name}'s queue for {model} on {host} is full (max_queued {bound})"
            return fail(RouteQueueFull(message, retry, name, bound))
        now = self._clock.seconds()
        enqueued = now if since is None else min(since, now)
        # `first`: a batch request stopped for a turn goes back before every other waiting one.
        seq = -next(self._firsts) if first else next(self._arrivals)
        waiter = Waiter(name, seq, enqueued, klass=klass, rank=klass)
        if tenant is not None:
            waiter.tenant, waiter.tenant_weight = tenant
        waiter.deferred = Deferred(lambda _: self._leave(key, slots, waiter))
        timeout = max(0.0, self._queue_timeout - (now - enqueued))
        waiter.timer = self._clock.callLater(timeout, self._expire, key, slots, waiter)
        slots.waiters.push(waiter)
        slots.waiting_by_class[klass] += 1
        state.waiting[key] += 1
        state.waiting_by_class[klass] += 1
        if work is not None:
            waiter.work = work
            self._waiting[work] = waiter
        for listener in self.on_wait:
            listener(host, model, state.limits.priority)
        if gate is not None:
            gate.changed(host)  # a model waiting for a place times its bound
        if klass == BATCH_RANK:
            self._rewake(key, slots)  # queued beside a free slot the turns keep
        else:
            self._plan_yield(key, slots)  # batch it waits behind may be stopped for it
        return waiter.deferred

    def track(
        self, host: str, model: str, route: RouteLimits | None = None, work: Work | None = None
    ) -> Release:
        """Count a request without waiting or refusing (in flight may exceed parallel); it
        counts in its route's in flight too."""
        key = (host, model)
        slots = self._entry(key)
        state = self._route(route)
        if self.gate is not None:
            self.gate.enter(host, model, force=True)
        slots.tracked += 1
        slots.tracked_total += 1
        state.tracked += 1
        self._start(key, slots, work)
        return self._release(key, slots, state, True, work)

    def withdraw(self, work: Work) -> bool:
        """Take the waiter of `work` out of its queue to go elsewhere (the valve): its Deferred
        fails with CancelledError, and it counts neither as cancelled nor timed out. False
        when it is not waiting (admitted, gone)."""
        waiter = self._waiting.get(work)
        if waiter is None:
            return False
        waiter.withdrawn = True
        assert waiter.deferred is not None
        waiter.deferred.cancel()
        return True

    # -- the expected wait

    def expected_wait(self, host: str, model: str, before: Work | None = None) -> float:
        """Seconds until a slot of (host, model) frees for one more request (module doc);
        `before`: for a request already waiting there, the time until its own turn (the
        waiters ahead of it only). 0 when a slot is free now; infinite while this instance may
        use none of its slots."""
        key = (host, model)
        limit = self._limit(key)
        if limit == 0:
            return float("inf")
        gated = 0.0
        if self.gate is not None:
            load = self.rates.load(host, model)
            gated = self.gate.wait(host, model, lambda other: self._drain((host, other)), load)
        slots = self._slots.get(key)
        if slots is None:
            return gated
        return gated + self._slot_wait(key, slots, limit, before)

    def _slot_wait(self, key: Pair, slots: SlotEntry, limit: int, before: Work | None) -> float:
        """`expected_wait` on the slots alone."""
        host, model = key
        mine = self._waiting.get(before) if before is not None else None
        rank = None if mine is None else self._rank(mine)
        ahead = [
            w.work
            for w in slots.waiters
            if w.work is not None and (rank is None or self._rank(w) < rank)
        ]
        if not ahead and slots.in_flight < limit:
            return 0.0
        pace, factor = self._pace(host, model), self.rates.factor(host, model)
        now = self._clock.seconds()
        return first_free(slots.running, ahead, limit, now, pace, factor)

    def _drain(self, key: Pair) -> float:
        """Seconds until every running and waiting request of (host, model) is done, played
        forward on its slots."""
        slots = self._slots.get(key)
        if slots is None or (not slots.in_flight and not slots.waiters):
            return 0.0
        limit = max(1, self._limit(key))
        pace, factor = self._pace(*key), self.rates.factor(*key)
        waiting = [w.work for w in slots.waiters]
        return all_done(slots.running, waiting, limit, self._clock.seconds(), pace, factor)

    def queued_prefill(self, host: str, model: str) -> int:
        """Prompt tokens the waiters of (host, model) will have its host prefill."""
        slots = self._slots.get((host, model))
        if slots is None:
            return 0
        return sum(w.work.prefill for w in slots.waiters if w.work is not None)

    def would_refuse(self, host: str, model: str, route: RouteLimits | None = None) -> bool:
        """Whether `acquire(host, model, route)` would be refused now (a full queue)."""
        key = (host, model)
        slots = self._slots.get(key)
        if slots is None or (not slots.waiters and slots.in_flight < self._limit(key)):
            return False
        limits = self._limits_of((route or DEFAULT_LIMITS).name, route or DEFAULT_LIMITS)
        bound = limits.queued_bound(self._queue_max)
        return len(slots.waiters) >= self._queue_max or slots.waiters.count(limits.name) >= bound

    def below_cap(self, route: RouteLimits | None) -> bool:
        """Whether one more request of `route` may be in flight (its max_in_flight)."""
        state = self._routes.get((route or DEFAULT_LIMITS).name)
        return state is None or state.below_cap()

    # -- reload and discovery

    def reconfigure(self, config: Config) -> None:
        """New queue limits and route limits (config reload). Waiters already queued keep their
        deadline and are placed again by their route's new priority and weight; a larger cap or
        a new priority admits at once where slots are free. A smaller `queue_max` or
        `max_queued` refuses newcomers until the queue is below it; a smaller cap revokes
        nothing. A route the new config does not serve keeps the limits it had."""
        self._queue_max = config.server.queue_max
        self._queue_timeout = config.server.queue_timeout
        self._config = config
        self._aging = config.server.class_aging
        self.rates.forget(set(config.hosts))
        if self.gate is not None:
            self.gate.forget(set(config.hosts))
        for name, state in self._routes.items():
            state.limits = self._limits_of(name, state.limits)
        for slots in self._slots.values():
            slots.waiters.rearrange()
        for key in sorted(self._slots):
            self._admit(key, self._slots[key])

    def resized(self, host: str, model: str) -> None:
        """`parallel(host, model)` changed: admit waiters into slots that are now free.

        A shrink revokes nothing: holders keep their slots, and waiters are admitted again only
        once in flight has fallen below the new parallel.
        """
        key = (host, model)
        slots = self._slots.get(key)
        if slots is not None:
            self._admit(key, slots)

    def resized_all(self) -> None:
        """Every `parallel` may have changed (another crossbar instance came or went)."""
        for key, slots in list(self._slots.items()):
            self._admit(key, slots)

    # -- views

    def total_in_flight(self) -> int:
        """Requests in flight over every (host, model)."""
        return sum(slots.in_flight for slots in self._slots.values())

    def in_flight_by_pair(self) -> dict[tuple[str, str], int]:
        """Requests in flight per (host, model), where any are (for the heartbeat)."""
        return {key: s.in_flight for key, s in self._slots.items() if s.in_flight}

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

    def by_class(self, host: str, model: str) -> dict[str, tuple[int, int]]:
        """Slots held and waiters of (host, model) per request class (by its own class, aged or
        not): {"interactive": (held, waiting), "standard": ..., "batch": ...}."""
        slots = self._slots.get((host, model))
        held = [0, 0, 0] if slots is None else slots.by_class
        waiting = [0, 0, 0]
        if slots is not None:
            for waiter in slots.waiters:
                waiting[waiter.klass] += 1
        return {name: (held[r], waiting[r]) for name, r in RANK.items()}

    def batch_cap(self, host: str, model: str) -> int:
        """The slots of (host, model) batch requests of a route at the defaults may hold now."""
        key = (host, model)
        slots = self._slots.get(key)
        if slots is None:  # nothing asked of it yet: made on first use, not by a view
            return max(1, self._limit(key) - 1)
        return self._batch_cap(key, slots, DEFAULT_LIMITS, BATCH_RANK)

    def batch_room(self, host: str, model: str, route: str = "") -> int:
        """Batch requests of `route` that (host, model) could start now under its batch cap,
        less the batch requests already waiting there: below 0, how far its batch queue runs
        past what its cap lets run. Where a batch request goes (leases/chooser.py)."""
        key = (host, model)
        slots = self._slots.get(key)
        state = self._routes.get(route)
        limits = self._limits_of(route, DEFAULT_LIMITS) if state is None else state.limits
        if slots is None:
            cap = limits.batch_slots
            return max(1, self._limit(key) - 1) if cap is None else cap
        cap = self._batch_cap(key, slots, limits, BATCH_RANK)
        return cap - slots.by_class[BATCH_RANK] - slots.waiting_by_class[BATCH_RANK]

    def queued_by_route(self, host: str, model: str) -> dict[str, int]:
        """Waiters of (host, model) per route name ("" for requests that named none)."""
        slots = self._slots.get((host, model))
        return {} if slots is None else slots.waiters.by_route()

    def route(self, name: str) -> RouteState | None:
        """The route's limits and counts over every (host, model); None while it is idle."""
        state = self._routes.get(name)
        return None if state is None else self._route_state(state)

    def routes(self) -> dict[str, RouteState]:
        """Every route with requests in flight or waiting, by name."""
        return {name: self._route_state(self._routes[name]) for name in sorted(self._routes)}

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
                    stopped=s.stopped,
                )
            )
        return states

    # -- the swap gate's view

    def wake(self, host: str) -> None:
        """Admit what may start on `host` now (the swap gate opened a place, or news of what
        the host runs came)."""
        for model in sorted(self._models.get(host, ())):
            key = (host, model)
            slots = self._slots[key]
            if slots.waiters:
                self._admit(key, slots)

    def _models_on(self, host: str) -> set[str]:
        return self._models.get(host, set())

    def _demand(self, host: str, model: str) -> Demand:
        slots = self._slots.get((host, model))
        if slots is None:
            return 0, 0, None
        oldest = min((w.enqueued for w in slots.waiters), default=None)
        return slots.in_flight, len(slots.waiters), oldest

    def _moved_on(self, key: Pair, ended: bool = False) -> None:
        """Something of (host, model) `ended` (a release) or left its queue: the gate may
        close or give a place."""
        gate = self.gate
        if gate is None:
            return
        if ended:
            gate.ended(*key)
        if gate.changed(key[0]):
            self.wake(key[0])

    # -- internals

    def _entry(self, key: Pair) -> SlotEntry:
        slots = self._slots.get(key)
        if slots is None:
            slots = self._slots[key] = SlotEntry(FairQueue(self._route_limits))
            self._models.setdefault(key[0], set()).add(key[1])
        return slots

    @staticmethod
    def _route_state(state: RouteEntry) -> RouteState:
        return RouteState(
            state.limits,
            state.in_flight,
            state.tracked,
            sum(state.waiting.values()),
            (state.by_class[0], state.by_class[1], state.by_class[2]),
            (state.waiting_by_class[0], state.waiting_by_class[1], state.waiting_by_class[2]),
        )

    def _route_limits(self, name: str) -> RouteLimits:
        # Every queued waiter's route has an entry: a route with waiters is never idle.
        return self._routes[name].limits

    def _limits_of(self, name: str, given: RouteLimits) -> RouteLimits:
        route = self._config.route(name) if self._config is not None and name else None
        return given if route is None else route.limits

    def _route(self, limits: RouteLimits | None) -> RouteEntry:
        given = DEFAULT_LIMITS if limits is None else limits
        state = self._routes.get(given.name)
        if state is None:
            limits = self._limits_of(given.name, given)
            state = self._routes[given.name] = RouteEntry(given.name, limits)
        return state

    def _forget_if_idle(self, state: RouteEntry) -> None:
        if not state.in_flight and not state.waiting:
            del self._routes[state.name]

    def _batch_room(self, key: Pair, slots: SlotEntry, limits: RouteLimits, rank: int) -> bool:
        """Whether a batch request of a route with `limits`, waiting at class `rank`, may take
        one more slot of `key`."""
        return slots.by_class[BATCH_RANK] < self._batch_cap(key, slots, limits, rank)

    def _batch_cap(self, key: Pair, slots: SlotEntry, limits: RouteLimits, rank: int) -> int:
        return batch_cap(slots, limits, rank, self._limit(key), self._clock.seconds())

    def _rewake(self, key: Pair, slots: SlotEntry) -> None:
        """Batch waits beside a free slot: admit again when its cap may rise by time alone
        (reserve.wake_at)."""
        if slots.wake is not None and slots.wake.active():
            slots.wake.cancel()
        slots.wake = None
        now = self._clock.seconds()
        when = wake_at(slots, self._limit(key), self._aging, now)
        if when is not None:
            slots.wake = self._clock.callLater(when - now, self._woken, key)

    def _woken(self, key: Pair) -> None:
        slots = self._slots[key]
        slots.wake = None
        self._admit(key, slots)

    def _plan_yield(self, key: Pair, slots: SlotEntry) -> None:
        """A turn (an interactive or standard request) waits: where a running batch request
        may be stopped for it, time that (reserve.yield_at); stop one when it comes."""
        if slots.yielding is not None and slots.yielding.active():
            slots.yielding.cancel()
        slots.yielding = None
        when = yield_at(slots)
        if when is not None:
            delay = max(0.0, when - self._clock.seconds())
            slots.yielding = self._clock.callLater(delay, self._yield, key)

    def may_stop(self, host: str, model: str) -> None:
        """A running batch request of (host, model) may be stopped now (its `work.stop` is
        set): a turn already waiting there times its bound."""
        slots = self._slots.get((host, model))
        if slots is not None:
            self._plan_yield((host, model), slots)

    def _yield(self, key: Pair) -> None:
        """Stop the batch request `reserve.to_stop` picks for the waiting turns; plan the
        next."""
        slots = self._slots[key]
        slots.yielding = None
        victim = to_stop(slots, self._clock.seconds())
        if victim is not None:
            stop, victim.stop = victim.stop, None
            slots.stopped += 1
            assert stop is not None
            stop()  # its release admits the turn; it queues again, first among batch
        self._plan_yield(key, slots)

    def _limit(self, key: Pair) -> int:
        # 0 is a share this instance may not use now (cluster/instances.py): its waiters wait
        # for the next heartbeat's `resized_all`. Below that, nothing is known: one slot.
        parallel = self._parallel(*key)
        return 0 if parallel == 0 else max(1, parallel)

    def _pace(self, host: str, model: str) -> tuple[float, float, float]:
        rates = self.rates
        return rates.prefill(host, model), rates.decode(host, model), rates.overhead(host, model)

    def _start(self, key: Pair, slots: SlotEntry, work: Work | None) -> None:
        if work is not None:
            work.started = self._clock.seconds()
            # Only an estimate made from what the host and route have shown may teach the
            # factor; the first guesses' errors say nothing of the next requests.
            learned = work.informed and self.rates.source(*key) == "learned"
            work.estimate = cost(work, self._pace(*key)) if learned else 0.0
            slots.running.add(work)

    def _rank(self, waiter: Waiter) -> tuple[int, int, int]:
        """Where a waiter stands in the admission order, roughly: a higher class first, then a
        higher priority, then arrival (the fair shares between lines and keys aside)."""
        return -waiter.rank, -self._routes[waiter.route].limits.priority, waiter.seq

    def _moved(self, key: Pair) -> None:
        for listener in self.on_moved:
            listener(*key)

    def _release(
        self,
        key: Pair,
        slots: SlotEntry,
        state: RouteEntry,
        tracked: bool,
        work: Work | None,
        klass: int = STANDARD_RANK,
    ) -> Release:
        started = self._clock.seconds()
        done = False

        def release() -> None:
            nonlocal done
            if done:
                return
            done = True
            if tracked:
                slots.tracked -= 1
                state.tracked -= 1
            else:
                slots.held -= 1
                slots.by_class[klass] -= 1
                state.held -= 1
                state.by_class[klass] -= 1
            held_for = self._clock.seconds() - started
            if work is not None:
                slots.running.discard(work)
                self.rates.learn_hold(key[0], key[1], work.estimate, held_for)
            average = slots.hold_average
            slots.hold_average = (
                held_for if average is None else average + _HOLD_WEIGHT * (held_for - average)
            )
            # The release rule: in flight was <= parallel before the decrement exactly when it
            # is < parallel now, and only then does a waiter get the slot.
            self._admit(key, slots)
            if state.limits.max_in_flight is not None:
                # The route's cap may have freed a place: its waiters elsewhere may take it.
                for pair in sorted(p for p in state.waiting if p != key):
                    self._admit(pair, self._slots[pair])
            self._moved_on(key, ended=True)
            self._forget_if_idle(state)
            self._moved(key)

        return release

    def _admit(self, key: Pair, slots: SlotEntry) -> None:
        gate = self.gate
        if slots.waiters:
            age(slots, self._aging, self._clock.seconds())

        def eligible(name: str, klass: int, rank: int) -> bool:
            state = self._routes[name]
            return state.below_cap() and (
                klass != BATCH_RANK or self._batch_room(key, slots, state.limits, rank)
            )

        while slots.in_flight < self._limit(key):
            if gate is not None and slots.waiters and not gate.admits(*key):
                return
            waiter = slots.waiters.take(eligible)
            if waiter is None:
                self._rewake(key, slots)
                return
            if gate is not None:
                gate.enter(*key)
            state = self._routes[waiter.route]
            self._unwait(state, key, waiter.klass)
            assert waiter.timer is not None and waiter.deferred is not None
            waiter.timer.cancel()
            slots.held += 1
            slots.admitted += 1
            slots.by_class[waiter.klass] += 1
            slots.waiting_by_class[waiter.klass] -= 1
            note_turns(slots, waiter.klass, self._clock.seconds())
            state.held += 1
            state.by_class[waiter.klass] += 1
            slots.wait_seconds += self._clock.seconds() - waiter.enqueued
            work = waiter.work
            if work is not None:
                del self._waiting[work]
                self._start(key, slots, work)
            # State is settled before the callback: it may re-enter (release, acquire).
            waiter.deferred.callback(self._release(key, slots, state, False, work, waiter.klass))

    def _unwait(self, state: RouteEntry, key: Pair, klass: int) -> None:
        state.waiting_by_class[klass] -= 1
        state.waiting[key] -= 1
        if not state.waiting[key]:
            del state.waiting[key]

    def _leave(self, key: Pair, slots: SlotEntry, waiter: Waiter) -> None:
        # The Deferred canceller: only runs while the waiter is still queued (a fired Deferred
        # ignores cancel), and Deferred.cancel then errbacks it with CancelledError.
        slots.waiters.remove(waiter)
        slots.waiting_by_class[waiter.klass] -= 1
        if not waiter.withdrawn:
            slots.cancelled += 1
        state = self._routes[waiter.route]
        self._unwait(state, key, waiter.klass)
        self._forget_if_idle(state)
        assert waiter.timer is not None
        waiter.timer.cancel()
        self._unqueue(waiter)
        self._moved_on(key)
        self._moved(key)

    def _unqueue(self, waiter: Waiter) -> None:
        if waiter.work is not None:
            self._waiting.pop(waiter.work, None)

    def _expire(self, key: Pair, slots: SlotEntry, waiter: Waiter) -> None:
        slots.waiters.remove(waiter)
        slots.waiting_by_class[waiter.klass] -= 1
        slots.timed_out += 1
        state = self._routes[waiter.route]
        self._unwait(state, key, waiter.klass)
        self._forget_if_idle(state)
        self._unqueue(waiter)
        self._moved_on(key)
        self._moved(key)
        assert waiter.deferred is not None
        host, model = key
        waited = self._clock.seconds() - waiter.enqueued
        waiter.deferred.errback(
            QueueTimeout(
                f"waited {waited:g}s for a slot for {model} on {host}",
                self._retry_after(key, slots),
            )
        )

    def _retry_after(self, key: Pair, slots: SlotEntry) -> float:
        hold = FIRST_HOLD_GUESS if slots.hold_average is None else slots.hold_average
        estimate = hold * (len(slots.waiters) + 1) / self._limit(key)
        # Retry-After is whole seconds; below 1 s a client would just hammer the queue.
        return max(1.0, min(estimate, self._queue_timeout))
