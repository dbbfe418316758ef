"""Evacuate a host: drain it, then move each of its conversations, prewarmed, to the host the
chooser picks, until it holds no leases and can be stopped.

The targets are planned up front, one lease after another, each counted where it will go, so
twenty conversations spread as twenty new leases would (the chooser's rules: peers, then the
lowest leases/parallel, then the most free slots). The moves then run together: each host
takes `prewarm_parallel` prewarms at a time (prewarm.py), so a host's prewarms queue there
while another host's go on. A conversation whose prewarm fails, or that has no kept body,
moves all the same (cold): the host must empty. Leases of a route pinned to the host stay
(a pin outranks everything), and are reported as left.

An evacuation `now` also stops the host's running streamed answers once its moves have begun:
each goes on, in its client's stream, on the host its conversation's lease is on by then (the
proxy's Resumer, seen here as `Streams`). A drain with a grace does the same when the grace
ends, if the host is still draining. Answers that cannot be continued run to their end.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

from attrs import define, field
from twisted.internet.defer import Deferred, DeferredList, DeferredLock
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from crossbar.config import Config
from crossbar.handoff.moves import HandOff, Moved
from crossbar.hosts import Hosts
from crossbar.leases import Chooser, Key, Table

log = Logger(namespace="crossbar.evacuate")
# Why a stopped answer was cut, as crossbar_resumes_total's `reason` says it.
EVACUATED = "evacuated"
DRAINED = "drained"


class Streams(Protocol):
    """The streamed answers running on each host that crossbar may stop to continue elsewhere
    (the proxy's Resumer)."""

    def streaming(self, host: str) -> int:
        """How many of `host`'s answers a stop would cut now."""
        ...

    def stop(self, host: str, why: str) -> int:
        """Cut them with cause `why`, each to go on where its conversation's lease is; how
        many were cut."""
        ...


@define
class Evacuation:
    """One host's evacuation as the admin API shows it."""

    host: str
    started: float
    total: int = 0
    moved: int = 0  # leases moved off the host (warm or cold)
    warm: int = 0  # of moved, those whose prewarm warmed the new host
    failed: int = 0  # leases that could not be moved (no other host, pinned)
    now: bool = False  # its running streams were stopped to go on elsewhere
    stopped: int = 0  # streamed answers stopped on the host, each continued elsewhere
    finished: float | None = None
    done: Deferred[None] = field(factory=Deferred, repr=False)

    @property
    def left(self) -> int:
        """Leases not yet moved (pending or failed)."""
        return self.total - self.moved

    @property
    def running(self) -> bool:
        return self.finished is None

    def view(self) -> dict[str, object]:
        """What `/api/hosts` and `POST /api/hosts/<name>/evacuate` show."""
        return {
            "total": self.total,
            "moved": self.moved,
            "warm": self.warm,
            "left": self.left,
            "failed": self.failed,
            "now": self.now,
            "stopped": self.stopped,
            "running": self.running,
            "started": self.started,
            "finished": self.finished,
        }


class Evacuator:
    """Runs evacuations, one per host at a time; keeps the latest of each host. Stops a
    host's running streams through `streams`, set once the proxy that runs them is built
    (None: there are none to stop)."""

    def __init__(
        self,
        clock: IReactorTime,
        config: Config,
        table: Table,
        hosts: Hosts,
        chooser: Chooser,
        handoff: HandOff,
    ) -> None:
        self._clock = clock
        self._config = config
        self._table = table
        self._hosts = hosts
        self._chooser = chooser
        self._handoff = handoff
        self.evacuations: dict[str, Evacuation] = {}
        self._starting: dict[str, DeferredLock] = {}
        self._graces: dict[str, IDelayedCall] = {}  # drained hosts whose streams stop later
        self.streams: Streams | None = None

    def reconfigure(self, config: Config) -> None:
        self._config = config

    async def start(self, host: str, now: bool = False) -> Evacuation:
        """Drain `host` and start moving its conversations (raises NoSuchHost); with `now`,
        stop its running streams too, each to go on on its conversation's new host. An
        evacuation already running is returned as it is (its streams stopped, with `now`)."""
        # One start per host at a time: a second one that comes while the first writes its
        # drain waits for it, and is then answered with the evacuation it began.
        lock = self._starting.setdefault(host, DeferredLock())
        try:
            return await lock.run(lambda: Deferred.fromCoroutine(self._start(host, now)))
        finally:
            if not lock.locked and not lock.waiting:
                self._starting.pop(host, None)

    async def _start(self, host: str, now: bool) -> Evacuation:
        current = self.evacuations.get(host)
        if current is not None and current.running:
            if now:  # an evacuation that waits for the host's answers is told not to
                current.now = True
                current.stopped += self.stop_streams(host, EVACUATED)
            return current
        await self._hosts.drain(host)
        evacuation = self.evacuations[host] = Evacuation(host, self._clock.seconds(), now=now)
        plan = self._plan(host)
        evacuation.total = len(plan)
        evacuation.failed = sum(1 for _, target in plan if target is None)
        log.info("evacuating {host}: {n} leases", host=host, n=len(plan))
        moves = [
            Deferred.fromCoroutine(self._move(evacuation, key, target))
            for key, target in plan
            if target is not None
        ]
        if now:
            # After the moves began: a stopped answer's conversation whose move has flipped
            # its lease goes on there; one whose prewarm still runs is moved off by the
            # continuation itself (reason `resumed`), and its move then leaves it be.
            evacuation.stopped = self.stop_streams(host, EVACUATED)
        finished = DeferredList(moves, consumeErrors=True)
        finished.addCallback(lambda _: self._finish(evacuation))
        return evacuation

    # -- running streams

    def streaming(self, host: str) -> int:
        """`host`'s running streams that a stop would move now."""
        return 0 if self.streams is None else self.streams.streaming(host)

    def stop_streams(self, host: str, why: str) -> int:
        """Stop `host`'s running streams that can go on elsewhere (`why`: evacuated,
        drained); how many were stopped. The others run to their end there."""
        if self.streams is None:
            return 0
        stopped = self.streams.stop(host, why)
        if stopped:
            log.info("{host}: {n} running answers stopped ({why}), each to go on elsewhere",
                     host=host, n=stopped, why=why)  # fmt: skip
        return stopped

    def stop_after(self, host: str, grace: float) -> int:
        """`host` was drained with a `grace`: its running streams are stopped when it ends,
        if the host is still draining then (at once for 0; how many, else 0). A later grace
        replaces an earlier one; `cancel_grace` (an undrain) forgets it."""
        self.cancel_grace(host)
        if grace <= 0:
            return self.stop_streams(host, DRAINED)
        self._graces[host] = self._clock.callLater(grace, self._grace_over, host)
        return 0

    def grace_ends(self, host: str) -> float | None:
        """When `host`'s drain grace ends (clock seconds), or None."""
        call = self._graces.get(host)
        return None if call is None else call.getTime()

    def cancel_grace(self, host: str) -> bool:
        """Forget `host`'s pending drain grace (it was undrained); whether there was one."""
        call = self._graces.pop(host, None)
        if call is None:
            return False
        if call.active():
            call.cancel()
        return True

    def _grace_over(self, host: str) -> None:
        self._graces.pop(host, None)
        if self._hosts.draining(host):  # undrained elsewhere (another instance): nothing
            self.stop_streams(host, DRAINED)

    def _plan(self, host: str) -> list[tuple[Key, str | None]]:
        """Each lease on `host` with the host it goes to (None: nowhere it may go)."""
        config, hosts, table = self._config, self._hosts, self._table
        planned: Counter[tuple[str, str]] = Counter()
        plan: list[tuple[Key, str | None]] = []
        leases = sorted(
            (x for x in table.snapshot() if x.host == host), key=lambda x: -x.last_used
        )  # the most recently used first: the likeliest to speak again soonest
        for lease in leases:
            key, model = lease.key, lease.key.model
            route = config.route(key.route)
            if route is None or table.pinned(key.route) == host:
                plan.append((key, None))
                continue
            candidates = config.hosts_for(route, model, hosts.models)
            usable = [
                h for h in candidates if h != host and hosts.healthy(h) and not hosts.draining(h)
            ]
            peers = table.hosts_with_lease(route.peers, model) if route.peers else set()

            def leases_on(h: str, model: str = model) -> int:
                return table.count(h, model) + planned[(h, model)]

            target = self._chooser.choose(usable, model, leases=leases_on, peers=peers)
            if target is not None:
                planned[(target, model)] += 1
            plan.append((key, target))
        return plan

    async def _move(self, evacuation: Evacuation, key: Key, target: str) -> Moved:
        moved = await self._handoff.move(key, target, "evacuate")
        if moved.moved or not self._still_on(key, evacuation.host):
            evacuation.moved += 1
            evacuation.warm += moved.prewarm.result == "warm"
        else:
            evacuation.failed += 1
        return moved

    def _still_on(self, key: Key, host: str) -> bool:
        return any(x.key == key and x.host == host for x in self._table.snapshot(key.route))

    def _finish(self, evacuation: Evacuation) -> None:
        evacuation.finished = self._clock.seconds()
        log.info(
            "evacuated {host}: {moved} of {total} leases moved ({warm} warm), {failed} left, "
            "{stopped} running answers moved",
            host=evacuation.host,
            stopped=evacuation.stopped,
            moved=evacuation.moved,
            total=evacuation.total,
            warm=evacuation.warm,
            failed=evacuation.failed,
        )
        evacuation.done.callback(None)
