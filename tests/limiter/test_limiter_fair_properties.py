"""Property tests of the shared limiter: with defaults it is the old FIFO exactly; with random
priorities, weights, caps and reloads it never overbooks, never passes a waiter over and never
strands one while its slot is free and its route below its cap."""

from __future__ import annotations

from typing import Any

from attrs import asdict
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from crossbar.config.limits import RouteLimits
from crossbar.config.values import Config, parse_config
from crossbar.limiter.slots import Limiter, Release
from tests.support import fifo_oracle

KEYS = [("titan", "qwen"), ("atlas", "qwen")]
ROUTES = ["a", "b", "c"]


def config(queue_max: int, queue_timeout: int, routes: dict[str, dict[str, Any]]) -> Config:
    hosts = {h: {"url": f"http://{h}:1", "models": ["qwen"]} for h, _ in KEYS}
    return parse_config(
        {
            "server": {"queue_max": queue_max, "queue_timeout": f"{queue_timeout}s"},
            "hosts": hosts,
            "routes": {
                name: {"hosts": [h for h, _ in KEYS], **keys} for name, keys in routes.items()
            },
        }
    )


def kind(failure: Any) -> str:
    """The failure's class by name: the oracle has classes of its own."""
    return type(failure.value).__name__


class DefaultsReproduceTheOldFifo(RuleBasedStateMachine):
    """Random histories over several routes at the defaults (and requests naming none): every
    outcome, retry hint, grant order and counter equals the old FIFO limiter's."""

    def __init__(self) -> None:
        super().__init__()
        self.parallel = dict.fromkeys(KEYS, 2)
        self.ours_clock, self.old_clock = Clock(), Clock()
        start = config(3, 10, {name: {} for name in ROUTES})
        self.ours = Limiter(self.ours_clock, lambda h, m: self.parallel[(h, m)], 3, 10, start)
        self.old = fifo_oracle.FifoLimiter(
            self.old_clock, lambda h, m: self.parallel[(h, m)], 3, 10
        )
        self.events: dict[str, list[tuple[int, str, float | None]]] = {"ours": [], "old": []}
        self.releases: dict[str, dict[int, Release]] = {"ours": {}, "old": {}}
        self.deferreds: dict[str, dict[int, Deferred[Any]]] = {"ours": {}, "old": {}}
        self.n = 0

    def _watch(self, side: str, d: Deferred[Any], n: int) -> None:
        def granted(release: Release) -> None:
            self.events[side].append((n, "granted", None))
            self.releases[side][n] = release

        def failed(failure: Any) -> None:
            retry = getattr(failure.value, "retry_after", None)
            self.events[side].append((n, kind(failure), retry))

        d.addCallbacks(granted, failed)
        self.deferreds[side][n] = d

    @rule(key=st.sampled_from(KEYS), route=st.sampled_from([*ROUTES, None]))
    def acquire(self, key: tuple[str, str], route: str | None) -> None:
        n, self.n = self.n, self.n + 1
        limits = None if route is None else RouteLimits(route)
        self._watch("ours", self.ours.acquire(*key, limits), n)
        self._watch("old", self.old.acquire(*key), n)

    @rule(key=st.sampled_from(KEYS), route=st.sampled_from([*ROUTES, None]))
    def track(self, key: tuple[str, str], route: str | None) -> None:
        n, self.n = self.n, self.n + 1
        limits = None if route is None else RouteLimits(route)
        self.releases["ours"][n] = self.ours.track(*key, limits)
        self.releases["old"][n] = self.old.track(*key)

    @precondition(lambda self: self.releases["ours"])
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        n = data.draw(st.sampled_from(sorted(self.releases["ours"])))
        self.releases["ours"][n]()
        self.releases["old"][n]()

    @precondition(lambda self: self.deferreds["ours"])
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        n = data.draw(st.sampled_from(sorted(self.deferreds["ours"])))
        self.deferreds["ours"][n].cancel()
        self.deferreds["old"][n].cancel()

    @rule(dt=st.integers(1, 6))
    def advance(self, dt: int) -> None:
        self.ours_clock.advance(dt)
        self.old_clock.advance(dt)

    @rule(key=st.sampled_from(KEYS), parallel=st.integers(1, 4))
    def resize(self, key: tuple[str, str], parallel: int) -> None:
        self.parallel[key] = parallel
        self.ours.resized(*key)
        self.old.resized(*key)

    @rule(queue_max=st.integers(0, 4), queue_timeout=st.integers(1, 20))
    def reload(self, queue_max: int, queue_timeout: int) -> None:
        new = config(queue_max, queue_timeout, {name: {} for name in ROUTES})
        self.ours.reconfigure(new)
        self.old.reconfigure(new)

    @invariant()
    def the_same_outcomes_in_the_same_order(self) -> None:
        assert self.events["ours"] == self.events["old"]
        for key in KEYS:
            assert self.ours.in_flight(*key) == self.old.in_flight(*key)
            assert self.ours.queued(*key) == self.old.queued(*key)
            assert self.ours.free_slots(*key) == self.old.free_slots(*key)
        assert [asdict(s) for s in self.ours.snapshot()] == [asdict(s) for s in self.old.snapshot()]


limits_strategy = st.fixed_dictionaries(
    {},
    optional={
        "priority": st.integers(-2, 2),
        "weight": st.sampled_from([0.5, 1, 3]),
        "max_in_flight": st.integers(1, 3),
        "max_queued": st.integers(0, 4),
    },
)


class SharedLimiterKeepsItsPromises(RuleBasedStateMachine):
    """Random acquire/track/release/cancel/clock/resize/reload across routes with random limits."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.parallel = dict.fromkeys(KEYS, 2)
        self.limiter: Limiter
        self.config: Config
        self.believed: dict[str, RouteLimits] = {}  # what requests carry: stale after a reload
        self.releases: dict[int, Release] = {}
        self.deferreds: dict[int, Deferred[Release]] = {}
        self.broken: list[str] = []  # promises broken at the moment of a grant
        self.n = 0

    @initialize(routes=st.fixed_dictionaries(dict.fromkeys(ROUTES, limits_strategy)))
    def start(self, routes: dict[str, dict[str, Any]]) -> None:
        self.config = config(6, 10, routes)
        self.limiter = Limiter(self.clock, lambda h, m: self.parallel[(h, m)], 6, 10, self.config)
        self.believed = {name: self.config.route(name).limits for name in ROUTES}

    def _limits(self, route: str) -> RouteLimits:
        return self.config.route(route).limits

    def _granted(self, release: Release, n: int, key: tuple[str, str], route: str) -> None:
        self.releases[n] = release
        limiter, mine = self.limiter, self._limits(route)
        if limiter.in_flight(*key) > max(1, self.parallel[key]):
            self.broken.append(f"{n}: {key} over parallel")
        if mine.max_in_flight is not None and limiter.route(route).in_flight > mine.max_in_flight:
            self.broken.append(f"{n}: {route} over its cap")
        for other, waiting in limiter.queued_by_route(*key).items():
            theirs = self._limits(other)
            state = limiter.route(other)
            if theirs.priority > mine.priority and theirs.below_cap(state.in_flight):
                self.broken.append(f"{n}: {route} passed {other} ({waiting} waiting, higher)")

    @rule(key=st.sampled_from(KEYS), route=st.sampled_from(ROUTES))
    def acquire(self, key: tuple[str, str], route: str) -> None:
        n, self.n = self.n, self.n + 1
        d = self.limiter.acquire(*key, self.believed[route])
        d.addCallbacks(self._granted, lambda f: f.trap(Exception), (n, key, route))
        self.deferreds[n] = d
        if not d.called:
            limits = self._limits(route)
            queued = self.limiter.queued_by_route(*key)
            assert queued[route] <= limits.queued_bound(self.config.server.queue_max)
            assert self.limiter.queued(*key) <= self.config.server.queue_max

    @rule(key=st.sampled_from(KEYS), named=st.booleans())
    def track(self, key: tuple[str, str], named: bool) -> None:
        # queue = false routes: never capped (the config refuses it); or a request naming none.
        n, self.n = self.n, self.n + 1
        self.releases[n] = self.limiter.track(*key, RouteLimits("ide") if named else None)

    @precondition(lambda self: self.releases)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.releases[data.draw(st.sampled_from(sorted(self.releases)))]()

    @precondition(lambda self: self.deferreds)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        self.deferreds[data.draw(st.sampled_from(sorted(self.deferreds)))].cancel()

    @rule(dt=st.integers(1, 6))
    def advance(self, dt: int) -> None:
        self.clock.advance(dt)

    @rule(key=st.sampled_from(KEYS), parallel=st.integers(1, 4))
    def resize(self, key: tuple[str, str], parallel: int) -> None:
        self.parallel[key] = parallel
        self.limiter.resized(*key)

    @rule(
        routes=st.fixed_dictionaries(dict.fromkeys(ROUTES, limits_strategy)),
        queue_max=st.integers(0, 6),
    )
    def reload(self, routes: dict[str, dict[str, Any]], queue_max: int) -> None:
        # Requests keep carrying the old limits: the limiter must go by the config's.
        self.config = config(queue_max, 10, routes)
        self.limiter.reconfigure(self.config)

    @invariant()
    def no_grant_broke_a_promise(self) -> None:
        assert self.broken == []

    @invariant()
    def no_waiter_is_stranded_while_its_slot_is_free_and_its_route_below_its_cap(self) -> None:
        if not hasattr(self, "limiter"):
            return
        for key in KEYS:
            if not self.limiter.free_slots(*key):
                continue
            for route in self.limiter.queued_by_route(*key):
                state = self.limiter.route(route)
                assert not self._limits(route).below_cap(state.in_flight), (key, route)

    @invariant()
    def routes_add_up_to_the_slots(self) -> None:
        if not hasattr(self, "limiter"):
            return
        routes = self.limiter.routes().values()
        assert sum(r.in_flight for r in routes) == sum(self.limiter.in_flight(*k) for k in KEYS)
        assert sum(r.queued for r in routes) == sum(self.limiter.queued(*k) for k in KEYS)
        for key in KEYS:
            assert sum(self.limiter.queued_by_route(*key).values()) == self.limiter.queued(*key)


TestDefaultsReproduceTheOldFifo = DefaultsReproduceTheOldFifo.TestCase
TestDefaultsReproduceTheOldFifo.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None
)
TestSharedLimiterKeepsItsPromises = SharedLimiterKeepsItsPromises.TestCase
TestSharedLimiterKeepsItsPromises.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None
)
