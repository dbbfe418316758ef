"""Rebalance (per route, `rebalance = true`): move idle conversations off a host whose queue
stays full to a candidate with free slots, prewarmed, so their next turns stop queueing there.

Every `tick` (the service runs it each second on its clock) each (host, model) is looked at:
one with waiters has been hot since the first tick that saw them; an empty queue cools it.
Once a host has been hot for a route's `rebalance_after` and another candidate of the route
for that model has free slots and nobody waiting, the route's least recently used
conversations on the hot host that have been idle for `rebalance_idle` and have no request in
flight move there (warm hand-off, moves.py; events say reason "rebalance"): as many per tick
as the cool host has free slots, at most `rebalance_per_minute` per route in any minute, and
only while the cool host, one lease more, stays no more loaded (leases per slot) than the hot
one, one lease fewer: a move costs a full prefill of its prompt, so nothing ever moves back.
Route leases (affinity = "route"), pinned routes and draining or unhealthy hosts never move.
"""

from __future__ import annotations

from collections import Counter, deque

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from crossbar.config import Config, Route
from crossbar.handoff.moves import HandOff
from crossbar.hosts import Hosts
from crossbar.leases import Lease, Table
from crossbar.limiter import Limiter

log = Logger(namespace="crossbar.rebalance")
TICK = 1.0  # seconds between looks; cheap: only queues with waiters lead anywhere
_MINUTE = 60.0


class Rebalancer:
    """Watches the queues and moves idle conversations of rebalancing routes."""

    def __init__(
        self,
        clock: IReactorTime,
        config: Config,
        table: Table,
        hosts: Hosts,
        limiter: Limiter,
        handoff: HandOff,
    ) -> None:
        self._clock = clock
        self._config = config
        self._table = table
        self._hosts = hosts
        self._limiter = limiter
        self._handoff = handoff
        self._hot_since: dict[tuple[str, str], float] = {}
        self._recent: dict[str, deque[float]] = {}  # per route: when its moves started
        self.moves: list[Deferred[object]] = []  # moves under way (tests wait on them)
        self._under_way: Counter[tuple[str, str]] = Counter()  # (host, model): leases coming

    def reconfigure(self, config: Config) -> None:
        self._config = config

    def tick(self) -> int:
        """Look at the queues now and start the moves due; returns how many started."""
        now = self._clock.seconds()
        self.moves = [d for d in self.moves if not d.called]
        for pair in list(self._hot_since):
            if self._limiter.queued(*pair) == 0:
                del self._hot_since[pair]
        for state in self._limiter.snapshot():
            if state.queued:
                self._hot_since.setdefault((state.host, state.model), now)
        if not self._hot_since:
            return 0
        routes = [r for r in self._routes() if r.rebalance]
        started = 0
        for route in routes:
            started += self._route_tick(route, now)
        return started

    def _routes(self) -> list[Route]:
        config = self._config
        names = {lease.key.route for lease in self._table.snapshot()}
        routes = [config.route(name) for name in sorted(names)]
        return [r for r in routes if r is not None]

    def _route_tick(self, route: Route, now: float) -> int:
        if self._table.pinned(route.name) is not None or route.per_route():
            return 0
        recent = self._recent.setdefault(route.name, deque())
        while recent and now - recent[0] >= _MINUTE:
            recent.popleft()
        started = 0
        for (host, model), since in sorted(self._hot_since.items()):
            if now - since < route.rebalance_after:
                continue
            candidates = self._config.hosts_for(route, model, self._hosts.models)
            if host not in candidates:
                continue
            cool = self._coolest(candidates, host, model)
            if cool is None:
                continue
            room = self._limiter.free_slots(cool, model)
            for lease in self._movable(route, host, model, now)[:room]:
                if len(recent) >= route.rebalance_per_minute:
                    return started
                if not self._evens_out(host, cool, model):
                    break
                recent.append(now)
                started += 1
                log.info(
                    "rebalance: {route} conversation {fp} moves {host} -> {cool}",
                    route=route.name, fp=lease.key.fp, host=host, cool=cool,
                )  # fmt: skip
                self.moves.append(self._move(lease, host, cool))
        return started

    def _move(self, lease: Lease, hot: str, cool: str) -> Deferred[object]:
        model = lease.key.model
        self._under_way[(cool, model)] += 1
        self._under_way[(hot, model)] -= 1

        def done(result: object) -> object:
            self._under_way[(cool, model)] -= 1
            self._under_way[(hot, model)] += 1
            return result

        move = Deferred.fromCoroutine(self._handoff.move(lease.key, cool, "rebalance"))
        return move.addBoth(done)

    def _evens_out(self, hot: str, cool: str, model: str) -> bool:
        """Whether one more lease on `cool` leaves it no more loaded (leases per slot) than
        `hot` with one fewer: moves stop once the two are even, so none ever comes back."""
        limiter = self._limiter

        def leases(host: str) -> int:  # moves under way counted where they go
            return self._table.count(host, model) + self._under_way[(host, model)]

        after_cool = (leases(cool) + 1) / max(1, limiter.parallel(cool, model))
        after_hot = (leases(hot) - 1) / max(1, limiter.parallel(hot, model))
        return after_cool <= after_hot

    def _coolest(self, candidates: list[str], hot: str, model: str) -> str | None:
        """The candidate with the most free slots and nobody waiting (config order breaks ties)."""
        limiter, hosts = self._limiter, self._hosts
        cool = [
            h
            for h in candidates
            if h != hot
            and hosts.healthy(h)
            and not hosts.draining(h)
            and limiter.queued(h, model) == 0
            and limiter.free_slots(h, model) > 0
        ]
        if not cool:
            return None
        return max(cool, key=lambda h: (limiter.free_slots(h, model), -candidates.index(h)))

    def _movable(self, route: Route, host: str, model: str, now: float) -> list[Lease]:
        """The route's idle conversations on `host`, least recently used first."""
        handoff = self._handoff
        idle = [
            lease
            for lease in self._table.snapshot(route.name)
            if lease.host == host
            and lease.key.model == model
            and lease.key.fp
            and now - lease.last_used >= route.rebalance_idle
            and not handoff.busy(lease.key)
            and not handoff.moving(lease.key)
        ]
        return sorted(idle, key=lambda lease: lease.last_used)
