"""The limiter's values, errors and per-(host, model) and per-route entries."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from attrs import define, field, frozen
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall

from crossbar.config import RouteLimits
from crossbar.limiter.fairqueue import FairQueue

Release = Callable[[], None]
Pair = tuple[str, str]  # (host, model)


class LimiterError(Exception):
    """The limiter refused a request; `retry_after` is a hint in seconds for the client."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QueueFull(LimiterError):
    """Refused at once: no free slot and the queue already holds `queue_max` waiters."""


class RouteQueueFull(QueueFull):
    """Refused at once: the route already has `max_queued` waiters for this (host, model)."""

    def __init__(self, message: str, retry_after: float, route: str, bound: int) -> None:
        super().__init__(message, retry_after)
        self.route = route
        self.bound = bound


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
    stopped: int = 0  # batch requests stopped for a waiting turn


@frozen
class RouteState:
    """One route as the limiter counts it over every (host, model)."""

    limits: RouteLimits
    in_flight: int  # acquired and tracked requests
    tracked: int
    queued: int
    # Held slots and waiters per request class rank (batch, standard, interactive).
    by_class: tuple[int, int, int] = (0, 0, 0)
    waiting_by_class: tuple[int, int, int] = (0, 0, 0)


def _nothing_streamed() -> int:
    return 0


@define(eq=False)
class Work:
    """What one request asks of its slot, for the expected wait (docs/reference.md, "Slots"):
    the prompt tokens its host must prefill, the output tokens it is expected to write, and
    once it holds a slot, since when and how many it has written (`streamed`: a stream's
    events so far; 0 for an answer that arrives whole)."""

    prefill: int = 0
    output: int = 0
    started: float | None = None  # clock seconds it got its slot; None while it waits
    estimate: float = 0.0  # seconds its slot was expected to be held, when it got it
    # Its output is its own limit or a learned mean, not a guess: its hold may teach the factor.
    informed: bool = True
    streamed: Callable[[], int] = _nothing_streamed
    # A batch request that may be stopped for a turn waiting this long (its route's
    # batch_yield_after; None: never), and how to stop it while its client has seen nothing
    # (set by the proxy only then; None otherwise).
    yield_after: float | None = None
    stop: Callable[[], None] | None = None


@define(eq=False)
class Waiter:
    """One request waiting in a (host, model)'s queue."""

    route: str
    seq: int  # arrival order over the whole limiter
    enqueued: float
    deferred: Deferred[Release] | None = None
    timer: IDelayedCall | None = None
    tenant: str = ""  # the named client key it is for ("" none): shares its route fairly
    tenant_weight: float = 1.0
    work: Work | None = None
    withdrawn: bool = False  # taken out to go elsewhere (the valve), not a client leaving
    klass: int = 1  # its request class (config/classes.py RANK): standard unless said
    rank: int = 1  # the class it waits at now: its own, raised by aging


@define(eq=False)
class RouteEntry:
    """A route's counts over every (host, model), while it has requests in flight or waiting."""

    name: str
    limits: RouteLimits
    held: int = 0
    tracked: int = 0
    waiting: Counter[Pair] = field(factory=Counter)  # waiters per (host, model)
    by_class: list[int] = field(factory=lambda: [0, 0, 0])  # held slots per class rank
    waiting_by_class: list[int] = field(factory=lambda: [0, 0, 0])  # waiters per own class

    @property
    def in_flight(self) -> int:
        return self.held + self.tracked

    def below_cap(self) -> bool:
        return self.limits.below_cap(self.in_flight)


@define(eq=False)
class SlotEntry:
    """One (host, model)'s slots, queue and counters."""

    waiters: FairQueue[Waiter]
    running: set[Work] = field(factory=set)  # the work of the requests holding its slots
    held: int = 0
    tracked: int = 0
    hold_average: float | None = None
    admitted: int = 0
    tracked_total: int = 0
    refused: int = 0
    timed_out: int = 0
    cancelled: int = 0
    wait_seconds: float = 0.0
    by_class: list[int] = field(factory=lambda: [0, 0, 0])  # held slots per class rank
    waiting_by_class: list[int] = field(factory=lambda: [0, 0, 0])  # waiters per own class
    # The most interactive and standard requests held at once lately, and when it was seen:
    # the slots batch leaves them (reserve.py `batch_cap`).
    turns_peak: int = 0
    turns_peak_at: float = float("-inf")
    wake: IDelayedCall | None = None  # batch waits beside a free slot: when its cap may rise
    yielding: IDelayedCall | None = None  # a turn waits behind batch that may be stopped for it
    stopped: int = 0  # batch requests stopped for a waiting turn

    @property
    def in_flight(self) -> int:
        return self.held + self.tracked
