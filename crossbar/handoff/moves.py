"""Warm hand-off: move a conversation to another host with its prompt already in that host's
cache, and see whether it paid off.

`move(key, host, reason)` prewarms the conversation's latest prompt on `host` (prewarm.py),
then moves its lease there (reason "evacuate" or "rebalance"). A turn of that conversation
arriving meanwhile waits for the move (at most `server.prewarm_timeout`, then it goes at once
to wherever its lease is), and is answered exactly once either way. The proxy tells this
module of every inference turn (it is the proxy's TurnGate): it waits for a move under way,
says which conversations have a request in flight (a rebalance never moves those), and, once a
turn has been answered, hands over its body for the store.
The first turn of a moved conversation on its new host reports how much of its prompt the
host had cached: that ratio goes to the `crossbar_handoff_cache_ratio` histogram.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from attrs import frozen
from prometheus_client import CollectorRegistry, Histogram
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from crossbar.config import Config
from crossbar.handoff.kept import HandoffStore
from crossbar.handoff.prewarm import PREWARMABLE, Outcome, Prewarmer, pack
from crossbar.leases import Key, Table
from crossbar.records import LeaseEvent, UsageRow
from crossbar.wire import Exchange, Inbound

if TYPE_CHECKING:
    from crossbar.tracing import Tracing

log = Logger(namespace="crossbar.handoff")
# Conversations whose last turn's span a move links to, at most (the oldest are forgotten).
_TURNS_KEPT = 100_000
_RATIO_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.8, 0.9, 0.95, 0.99, 1.0)


@frozen
class Moved:
    """One hand-off done: the lease moved (`moved`) and how its prewarm went."""

    key: Key
    origin: str
    host: str
    moved: bool
    prewarm: Outcome


class HandOff:
    """Moves under way, turns in flight, kept bodies and the hand-off ratio."""

    def __init__(
        self,
        clock: IReactorTime,
        config: Config,
        table: Table,
        store: HandoffStore,
        prewarmer: Prewarmer,
        registry: CollectorRegistry,
        tracing: Tracing | None = None,
    ) -> None:
        self._clock = clock
        self._tracing = tracing
        self._turns: dict[Key, Any] = {}  # key -> its last turn's SpanContext (tracing on)
        self._config = config
        self._table = table
        self.store = store
        self.prewarmer = prewarmer
        self._moving: dict[Key, list[Deferred[None]]] = {}  # waiting turns per moving key
        self._in_flight: Counter[Key] = Counter()
        self._first_turn: dict[Key, str] = {}  # moved conversations -> their new host
        self.ratio = Histogram(
            "crossbar_handoff_cache_ratio",
            "Cached share of the prompt on a moved conversation's first turn on its new host.",
            buckets=_RATIO_BUCKETS,
            registry=registry,
        )

    def reconfigure(self, config: Config) -> None:
        self._config = config
        self.prewarmer.reconfigure(config)

    # -- moves

    def moving(self, key: Key) -> bool:
        """Whether a hand-off of `key` is under way."""
        return key in self._moving

    def busy(self, key: Key) -> bool:
        """Whether `key` has a request in flight."""
        return self._in_flight[key] > 0

    async def move(self, key: Key, host: str, reason: str) -> Moved:
        """Prewarm `key` on `host`, then move its lease there with `reason` (unless it has
        left the host it was on meanwhile)."""
        lease = next((x for x in self._table.snapshot(key.route) if x.key == key), None)
        origin = "" if lease is None else lease.host
        if key in self._moving:
            return Moved(key, origin, host, False, Outcome("failed", detail="already moving"))
        self._moving[key] = []
        tracing, span = self._tracing, None
        if tracing is not None:
            turn = self._turns.get(key)
            span = tracing.move(key.route, key.fp, key.model, origin, host, reason, turn)
        try:
            outcome = await self._prewarm(key, host, span)
            # Only from where it was: a lease that left meanwhile (its answer, stopped on the
            # old host, went on elsewhere and took it along) stays where that answer went.
            now = self._clock.seconds()
            moved = await self._table.move(key, host, now, reason, origin or None)
            if moved:
                self._first_turn[key] = host
            if span is not None and tracing is not None:
                attributes = {
                    "crossbar.move.moved": moved,
                    "crossbar.prewarm.result": outcome.result,
                }
                tracing.end(span, attributes, "" if moved else "not_moved")
                span = None
            return Moved(key, origin, host, moved, outcome)
        finally:
            if span is not None and tracing is not None:  # the move failed or was cancelled
                tracing.end(span, None, "failed")
            for waiter in list(self._moving.pop(key, [])):
                waiter.callback(None)

    async def _prewarm(self, key: Key, host: str, span: Any) -> Outcome:
        try:
            return await self.prewarmer.prewarm(key, host, span)
        except Exception as e:  # a prewarm that fails moves the conversation cold
            log.failure("prewarm of {key} on {host} failed", key=key, host=host)
            return Outcome("failed", detail=str(e))

    # -- turns (the proxy's TurnGate)

    async def wait_for_move(self, key: Key) -> None:
        """Returns once no move of `key` is under way, or after prewarm_timeout."""
        if key in self._moving:  # the only case with anything to wait for
            await self._settled(key)

    @contextmanager
    def in_flight(self, key: Key) -> Iterator[None]:
        """While a turn of `key` runs: a rebalance never moves a busy conversation."""
        self._in_flight[key] += 1
        try:
            yield
        finally:
            self._in_flight[key] -= 1
            if not self._in_flight[key]:
                del self._in_flight[key]

    def answered(self, key: Key, ex: Exchange, inbound: Inbound) -> None:
        """A turn of `key` was answered: its body is kept for a later hand-off (a copy, made
        only when bodies are kept)."""
        if self.store.enabled and ex.status == 200 and not ex.error and inbound.path in PREWARMABLE:
            self.store.keep(key, pack(inbound.path, inbound.raw))
        if ex.trace is not None:  # tracing on: a later move of `key` links to this turn
            turns = self._turns
            turns.pop(key, None)
            if len(turns) >= _TURNS_KEPT:
                del turns[next(iter(turns))]
            turns[key] = ex.trace.span.get_span_context()

    def _settled(self, key: Key) -> Deferred[None]:
        """Fires when `key` is not moving, or after prewarm_timeout."""
        d: Deferred[None] = Deferred()
        waiters = self._moving.get(key)
        if waiters is None:
            d.callback(None)
            return d
        waiters.append(d)
        timer = self._clock.callLater(self._config.server.prewarm_timeout, d.callback, None)

        def done(result: object) -> object:
            if timer.active():
                timer.cancel()
            if d in waiters:
                waiters.remove(d)
            return result

        d.addBoth(done)
        return d

    # -- what happened

    def observe(self, row: UsageRow) -> None:
        """A usage row (observer): the first turn of a moved conversation on its new host."""
        if row.lease == "prewarm" or not row.prompt_tokens or row.status != 200:
            return
        for key in (Key(row.route, row.fp, row.model), Key(row.route, "", row.model)):
            host = self._first_turn.get(key)
            if host is not None and host == row.host:
                del self._first_turn[key]
                self.ratio.observe(min(1.0, row.cached_tokens / row.prompt_tokens))
                return

    def lease_event(self, event: LeaseEvent) -> None:
        """A lease dropped (a Table listener): its conversation's body and ratio go."""
        if event.to_host or not event.model:
            return  # a lease made or moved, or a pin
        key = Key(event.route, event.fp, event.model)
        self._first_turn.pop(key, None)
        self._turns.pop(key, None)
        self.store.drop(key)  # its conversation is over for crossbar: so is its body
