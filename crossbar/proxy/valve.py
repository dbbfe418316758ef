"""The valve: stickiness that gives way when waiting at home costs more than moving
(docs/reference.md, "Leases": the valve).

An inference turn on a conversation lease that must wait for a slot on its home host is judged
against every other candidate of its route that could take it (healthy, not draining, not held
down, serving the model, its queue not full, its context large enough):

- stay = the expected wait at home (limiter/slots.py `expected_wait`, for the turn's own place
  in the queue) plus what it must prefill there: its new tokens, and the part of its history the
  host has lately been evicting (pace.py `held_on`);
- move = the expected wait on the candidate plus its prompt less what that host holds of it (a
  shared system prompt), at the candidate's prefill rate; on a router-mode host that has the
  model not loaded, the expected wait holds the load (the swap gate's wait); a host that would
  have to unload the only place of a model with active conversations is none, nor one the model
  cannot run on (it failed to load there).

It moves to the best candidate when stay > move x `valve_margin` + `valve_slack`: the slot there
is taken first (so two turns judged at once never both count on one free slot), then the lease
moves (reason `busy`, only from the host it was judged on: two instances never move one
conversation twice), and the conversation stays on its new host like any other. A turn is
judged when it queues and again while it waits: whenever a slot or a queue of its model moves
elsewhere (limiter `on_moved`), and every JUDGE_EVERY seconds. A turn of a conversation that
came to its host by a move less than `valve_hold` ago and has served a turn there since never
moves, nor one whose route is at its `max_in_flight` (no host would start it sooner); pinned
routes, `affinity = "route"` and `queue = false` never come here.
"""

from __future__ import annotations

from typing import Any

from attrs import define, field, frozen
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from crossbar.hosts import Hosts
from crossbar.leases import EVICTS, Acquired, Table, Warmth
from crossbar.limiter import Limiter, Release, Work
from crossbar.proxy.call import Call
from crossbar.proxy.loaded import LoadedModels
from crossbar.proxy.pace import held_on
from crossbar.wire import Kind

log = Logger(namespace="crossbar.valve")
JUDGE_EVERY = 1.0  # seconds between a waiting turn's judgements when nothing else moves


@frozen
class Verdict:
    """A move the valve decided: to `host`, where the turn should start `move` seconds from
    now against `stay` at home, prefilling `prefill` tokens there."""

    host: str
    stay: float
    move: float
    prefill: int


@frozen
class Turn:
    """A queued inference turn the valve may move."""

    call: Call
    home: str
    work: Work
    prompt: int  # its prompt tokens: the guard's exact count, else the estimate
    warm: int  # tokens its conversation's last turn left on the home host
    tenant: tuple[str, float] | None
    since: float  # when it began to wait
    klass: int = 1  # its request class's rank (proxy/classes.py)


@frozen
class Placed:
    """Where a turn got its slot: `host`, and the valve's verdict when it moved there."""

    release: Release
    host: str
    verdict: Verdict | None = None


class Replace(Exception):
    """The valve chose a host, but the lease was not where it judged it (another instance
    moved it, or it went): the turn is placed again from the start."""


@define(eq=False)
class _Waiting:
    turn: Turn
    outcome: Deferred[Any]
    verdict: Verdict | None = None  # decided, the waiter being withdrawn
    timer: IDelayedCall | None = None
    due: IDelayedCall | None = field(default=None)  # a judgement asked for by a queue moving


class Valve:
    """Judges queued turns and moves them (module doc); one per proxy."""

    def __init__(
        self,
        clock: IReactorTime,
        table: Table,
        hosts: Hosts,
        limiter: Limiter,
        warmth: Warmth,
        loaded: LoadedModels | None = None,
    ) -> None:
        self._clock = clock
        self._table = table
        self._hosts = hosts
        self._limiter = limiter
        self._warmth = warmth
        self._loaded = loaded
        self._waiting: dict[str, set[_Waiting]] = {}  # model -> its turns waiting
        limiter.on_moved.append(self._queue_moved)

    @staticmethod
    def eligible(call: Call, acquired: Acquired) -> bool:
        """Whether a turn may be moved at all: an inference turn on a conversation's own lease
        of a route whose valve can open, not pinned, not naming a running completion."""
        return (
            call.kind is Kind.INFERENCE
            and bool(call.key.fp)
            and call.route.valves()
            and not acquired.pinned
            and call.origin is None
        )

    def judge(self, turn: Turn) -> Verdict | None:
        """The best host to move `turn` to now, or None to stay (module doc)."""
        call, home, now = turn.call, turn.home, self._clock.seconds()
        route, model = call.route, call.model
        lease = self._table.lease(call.key)
        if lease is None or lease.host != home:
            return None
        if lease.moved and now - lease.created < route.valve_hold:
            # No ping-pong: it moved here lately and its cache here is worth keeping; unless
            # this instance moved it and no turn has been served here since (a cold move that
            # landed on a busy host): then it holds nothing here to lose.
            if lease.turn_prompt or lease.remote:
                return None
        if self._table.pinned(route.name) in call.candidates:
            return None  # pinned since it was placed
        limits = route.limits
        limiter, hosts, warmth = self._limiter, self._hosts, self._warmth
        rates = limiter.rates
        if not limiter.below_cap(limits):
            return None  # it waits for its route's cap, which no other host lifts
        held = held_on(warmth, home, call, turn.prompt, turn.warm)
        stay = limiter.expected_wait(home, model, before=turn.work)
        stay += (turn.prompt - held) / rates.prefill(home, model)
        best: Verdict | None = None
        for host in call.candidates:
            if host == home or not hosts.healthy(host) or hosts.draining(host):
                continue
            if hosts.held_down(host) or limiter.would_refuse(host, model, limits):
                continue
            ctx = hosts.ctx(host, model)
            if ctx is not None and turn.prompt >= ctx:
                continue
            loaded = self._loaded
            if loaded is not None and loaded.tier(host, model) >= EVICTS:
                # Never to a host that would unload another model's only place with active
                # conversations: staying is a choice, and that unload is one more move.
                continue
            prefill = turn.prompt - held_on(warmth, host, call, turn.prompt, 0, home=False)
            move = limiter.expected_wait(host, model) + prefill / rates.prefill(host, model)
            if loaded is not None:
                move += loaded.extra_cost(host, model)
            if best is None or move < best.move:
                best = Verdict(host, stay, move, prefill)
        if best is None or stay <= best.move * route.valve_margin + route.valve_slack:
            return None
        return best

    async def wait(self, turn: Turn, pending: Deferred[Release]) -> Placed:
        """Wait for `pending` (the turn's slot at home), judging the turn now and while it
        waits; a verdict withdraws it and moves it (`_move`). Cancelling leaves the queue."""
        outcome: Deferred[Any] = Deferred(lambda _: pending.cancel())
        waiting = _Waiting(turn, outcome)

        def admitted(release: Release) -> None:
            if outcome.called:  # not reached: a withdrawn waiter is never admitted
                release()
                return
            outcome.callback(release)

        def failed(failure: Failure) -> None:
            if outcome.called:
                return
            if waiting.verdict is not None and failure.check(CancelledError):
                outcome.callback(waiting.verdict)  # withdrawn by our own verdict
            else:
                outcome.errback(failure)

        pending.addCallbacks(admitted, failed)
        self._watch(waiting)
        try:
            self._judge(waiting)
            result = await outcome
        finally:
            self._unwatch(waiting)
        if isinstance(result, Verdict):
            return await self._move(turn, result)
        return Placed(result, turn.home)

    async def _move(self, turn: Turn, verdict: Verdict) -> Placed:
        """Take a slot on the verdict's host, then move the lease there (reason `busy`)."""
        call, work, limiter = turn.call, turn.work, self._limiter
        work.prefill = verdict.prefill
        slot = limiter.acquire(
            verdict.host,
            call.model,
            call.route.limits,
            turn.tenant,
            work,
            since=turn.since,
            klass=turn.klass,
        )
        if slot.called:  # a refusal comes at once; `judge` saw the queue not full
            refused: list[Failure] = []
            slot.addErrback(refused.append)
            if refused:
                raise Replace()
        try:
            now = self._clock.seconds()
            moved = await self._table.move(call.key, verdict.host, now, "busy", turn.home)
        except BaseException:
            _let_go(limiter, work, slot)
            raise
        if not moved:
            _let_go(limiter, work, slot)
            raise Replace()
        log.info(
            "valve: {route} conversation {fp} moves {home} -> {host} "
            "(stay {stay:.2f}s, move {move:.2f}s)",
            route=call.route.name, fp=call.key.fp, home=turn.home, host=verdict.host,
            stay=verdict.stay, move=verdict.move,
        )  # fmt: skip
        return Placed(await slot, verdict.host, verdict)

    # -- judging again while turns wait

    def _watch(self, waiting: _Waiting) -> None:
        self._waiting.setdefault(waiting.turn.call.model, set()).add(waiting)
        waiting.timer = self._clock.callLater(JUDGE_EVERY, self._tick, waiting)

    def _unwatch(self, waiting: _Waiting) -> None:
        model = waiting.turn.call.model
        turns = self._waiting.get(model)
        if turns is not None:
            turns.discard(waiting)
            if not turns:
                del self._waiting[model]
        for timer in (waiting.timer, waiting.due):
            if timer is not None and timer.active():
                timer.cancel()

    def _tick(self, waiting: _Waiting) -> None:
        waiting.timer = self._clock.callLater(JUDGE_EVERY, self._tick, waiting)
        self._judge(waiting)

    def _queue_moved(self, host: str, model: str) -> None:
        """A slot or queue of (host, model) moved: the turns of `model` waiting on other hosts
        are judged again, once the limiter's own step is over."""
        for waiting in self._waiting.get(model, ()):
            if waiting.turn.home != host and (waiting.due is None or not waiting.due.active()):
                waiting.due = self._clock.callLater(0, self._judge, waiting)

    def _judge(self, waiting: _Waiting) -> None:
        if waiting.outcome.called or waiting.verdict is not None:
            return
        try:
            verdict = self.judge(waiting.turn)
        except Exception:
            # A bug here must not strand the turn: it keeps its place at home.
            log.failure("the valve could not judge a waiting turn")
            return
        if verdict is None:
            return
        waiting.verdict = verdict
        if not self._limiter.withdraw(waiting.turn.work):
            waiting.verdict = None  # admitted meanwhile: it goes home after all


def _let_go(limiter: Limiter, work: Work, slot: Deferred[Release]) -> None:
    """Give back a slot taken for a move that did not happen: leave its queue, or release it."""
    if limiter.withdraw(work):
        slot.addErrback(lambda f: f.trap(CancelledError))
        return
    slot.addCallbacks(lambda release: release(), lambda f: None)
