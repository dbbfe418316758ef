"""What each key may spend and has spent, charged before its request runs
(docs/operator-guide.md, "Tenants").

A request of a key with limits is admitted only if its estimated cost fits every limit; the
estimate is then reserved (counted as spent), and settled to the true cost when the answer
ends, whatever way it ends (a stream cut short settles what was delivered); an answer relayed
whole is settled before its request finishes, so a request pipelined behind it on the same
connection finds its place in `max_in_flight` given back. So concurrent
requests cannot overshoot a limit by more than what their estimates missed, and a request
whose estimate alone is larger than a whole limit runs only when nothing else of the key
holds that limit (then it overshoots by at most itself).

The estimate is the prompt (the guard's count or estimate) and the output the request is
expected to write: its own limit (`max_tokens` and the like, up to OUTPUT_ESTIMATE_CAP), else
the larger of the key's mean completion and its route's mean, the key's being
DEFAULT_OUTPUT_ESTIMATE (1024) until one of its answers has settled; never more than what is
left of the host's context. Never 0, and never below the route's mean: a burst of a new key's
first requests is held to what that default lets through (one of them, for a small key), and
a route's mean learned from other keys' short answers cannot lower a key's estimate below its
own. Without output limits, a key so overshoots a limit by at most what its in-flight
requests' answers write beyond its own mean.

- **rpm, tpm**: token buckets holding a minute's worth, refilled continuously; a request takes
  1 from the rpm bucket and its estimate from the tpm bucket, and the settlement gives back or
  takes the difference (the bucket may go below zero: the next requests wait for it).
- **max_in_flight**: requests admitted and not yet settled.
- **tokens_per_day / tokens_per_month**: UTC calendar periods. What the key spent there is
  this instance's settled and reserved costs, plus what the other instances sharing the store
  had spent at the last sync (`pending` / `synced`, a timer of the service).

Several instances: each takes its `Share` of the rates and of `max_in_flight` (as slots are
shared, one at least), and of what remained of each budget at the last sync, so together they
stay within the limits (a budget by at most one estimate per instance). A share is never too
small to serve: where an instance's part of `rpm` is under one request (rpm below the live
instances), a request runs when its bucket is full and the bucket refills at the share, so
rpm 1 on two instances serves one request every two minutes on each: one a minute together
over time, at most one a minute on each. A tpm share smaller than a request's estimate is
served the same way.

Cost: prompt tokens not cached + cached tokens x `cached_weight` + completion tokens.
"""

from __future__ import annotations

import calendar
import math
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, Protocol

from attrs import define, field
from twisted.logger import Logger

from crossbar.config import KeyLimits
from crossbar.tenants.values import ClientKey, OverLimit

log = Logger(namespace="crossbar.keys")
_MINUTE = 60.0
_LOG_EVERY = 60.0  # a key's refusals are logged once a minute at most
_SYNC_RETRY = 2.0  # this instance's share of a budget is spent; the next sync may give more
_DUST = 1e-9  # float error: a bucket refilled to just what a request needs admits it
_MEAN_WEIGHT = 0.2  # of the newest completion in a key's running mean
OUTPUT_ESTIMATE_CAP = 4096  # an output limit counts in an estimate up to this many tokens
# What a request without an output limit is expected to write before its key or its route
# has shown any: a guess that errs high, so a burst of a new key's first requests cannot
# overshoot its limits many times over (an estimate of 0 admits them all; LiteLLM #18730).
DEFAULT_OUTPUT_ESTIMATE = 1024


class Share(Protocol):
    """This instance's part of each key's limits, among the instances sharing the store."""

    def fraction(self) -> float: ...

    def part(self, total: int) -> int: ...


class _Alone:
    def fraction(self) -> float:
        return 1.0

    def part(self, total: int) -> int:
        return total


ALONE: Share = _Alone()


_DAY = 86400.0
_periods: list = [float("inf"), float("-inf"), ("", "")]  # the day cached: [start, end, ids]


def period_ids(now: float) -> tuple[str, str]:
    """The UTC day and month `now` falls in: ("d2026-12-01", "m2026-12"). Worked out once
    a day (every admitted request asks)."""
    start, end, ids = _periods
    if start <= now < end:
        return ids
    t = time.gmtime(now)
    ids = f"d{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}", f"m{t.tm_year:04d}-{t.tm_mon:02d}"
    start = now - now % _DAY
    _periods[:] = [start, start + _DAY, ids]
    return ids


def period_start(period: str) -> float:
    """Seconds since the epoch at which a period of `period_ids` begins."""
    parts = [int(p) for p in period[1:].split("-")]
    year, month, day = parts[0], parts[1], parts[2] if len(parts) > 2 else 1
    return float(calendar.timegm((year, month, day, 0, 0, 0)))


def _until_next_day(now: float) -> float:
    return _MINUTE * 24 * 60 - now % 86400.0


def _until_next_month(now: float) -> float:
    t = time.gmtime(now)
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return calendar.timegm((year, month, 1, 0, 0, 0)) - now


@define
class _Bucket:
    """A minute's worth of something, refilled continuously; None: full, never used."""

    level: float | None = None
    at: float = 0.0

    def now(self, cap: float, now: float) -> float:
        if self.level is None:
            return cap
        return min(cap, self.level + cap * max(0.0, now - self.at) / _MINUTE)

    def take(self, amount: float, cap: float, now: float) -> None:
        self.level = self.now(cap, now) - amount
        self.at = now

    def set(self, level: float, now: float) -> None:
        """The level read at `now` (by `now`), less what was taken."""
        self.level = level
        self.at = now


@define
class _Budget:
    """One key's spending in one period (a day or a month)."""

    period: str = ""
    spent: float = 0.0  # settled, this instance
    reserved: float = 0.0  # admitted and not settled, this instance
    others: float = 0.0  # the other instances', at the last sync
    synced: float = 0.0  # `spent` as the last sync wrote it

    def roll(self, period: str) -> None:
        if period != self.period:
            self.period, self.spent, self.reserved = period, 0.0, 0.0
            self.others = self.synced = 0.0

    def used(self) -> float:
        return self.others + self.spent + self.reserved

    def room(self, budget: int, fraction: float) -> float:
        """What this instance may still reserve: its share of what remained at the last
        sync, less what it spent and reserved since."""
        remaining = max(0.0, budget - self.others - self.synced)
        return self.synced + fraction * remaining - self.spent - self.reserved


@define
class _State:
    """What the meter knows of one key."""

    rpm: _Bucket = field(factory=_Bucket)
    tpm: _Bucket = field(factory=_Bucket)
    in_flight: int = 0
    day: _Budget = field(factory=_Budget)
    month: _Budget = field(factory=_Budget)
    minute: deque[tuple[float, float]] = field(factory=deque)  # (at, cost) of the last minute
    completion_mean: float | None = None
    limited: Counter[str] = field(factory=Counter)
    logged_at: float = float("-inf")
    requests: int = 0


class Reservation:
    """One admitted request's charge; `settle` it once with its true tokens (idempotent)."""

    __slots__ = (
        "_meter", "cached", "day", "estimate", "limits", "month", "name", "prompt", "settled"
    )  # fmt: skip

    def __init__(
        self,
        meter: KeyMeter,
        name: str,
        limits: KeyLimits,
        estimate: float,
        day: str,
        month: str,
        prompt: int = 0,
        cached: int = 0,
    ) -> None:
        self._meter = meter
        self.prompt = prompt  # the prompt tokens (and cached ones) the estimate expected
        self.cached = cached
        self.name = name
        self.limits = limits
        self.estimate = estimate
        self.day = day
        self.month = month
        self.settled = False

    def settle(self, prompt: int, cached: int, completion: int, now: float) -> float:
        """Charge the true cost in place of the estimate; returns the cost (0 when settled
        before). An answer cut before it reported its prompt (a stream ended early: llama-server
        counts the prompt in its last chunk) but after delivering tokens is charged the
        expected prompt: the host did read it."""
        if self.settled:
            return 0.0
        self.settled = True
        if prompt == 0 and completion > 0:
            prompt, cached = self.prompt, self.cached
        cost = self.limits.cost(prompt, cached, completion)
        return self._meter._settle(self, cost, now, completion if completion or prompt else None)

    def ran(self, prompt: int, cached: int, completion: int, now: float) -> float:
        """Charge, besides the answer this reservation settles, a run of the request that was
        stopped before it answered (a batch request stopped for a waiting turn): the host read
        `prompt` (`cached` of it cached) and wrote about `completion` for it. Never refused:
        the work is done. Returns its cost."""
        cost = self.limits.cost(prompt, cached, completion)
        self._meter._spend(self, cost, now)
        return cost

    def keep(self, now: float) -> float:
        """Settle at the estimate: the host's counts were refused (wire/reported.py), so the
        key pays what the request was expected to cost, never a refund on a host's word, and
        its mean completion learns nothing."""
        if self.settled:
            return 0.0
        self.settled = True
        return self._meter._settle(self, self.estimate, now, None)


class KeyMeter:
    """Every key's limits as this instance charges them (the module's docstring)."""

    def __init__(self, share: Share = ALONE) -> None:
        self.share = share
        self._states: dict[str, _State] = {}
        self.listeners: list[Callable[[OverLimit], None]] = []  # hear each refusal

    def _state(self, name: str) -> _State:
        state = self._states.get(name)
        if state is None:
            state = self._states[name] = _State()
        return state

    def forget(self, name: str) -> None:
        """A deleted key."""
        self._states.pop(name, None)

    # -- admission

    def estimate(
        self,
        key: ClientKey,
        prompt: int,
        cached: int,
        output_limit: int | None,
        route_mean: float | None = None,
        context_left: int | None = None,
    ) -> float:
        """A request's expected cost: its prompt (`cached` of it expected cached) and the
        output it is expected to write: its output limit when it sets one (up to
        OUTPUT_ESTIMATE_CAP), else the larger of the key's mean completion so far (before its
        first answer, DEFAULT_OUTPUT_ESTIMATE) and its route's (`route_mean`, None before any
        answer); never more than what is left of the host's context (`context_left`, when
        known: the host stops there)."""
        if output_limit is not None and output_limit > 0:
            output = float(min(output_limit, OUTPUT_ESTIMATE_CAP))
        else:
            # The larger of the key's mean and its route's: a route's mean learned from other
            # keys' short (capped) answers once let a key with no mean of its own pass its
            # tpm nearly twice over. Before the key has a mean, the default at least.
            mean = self._state(key.name).completion_mean
            floor = float(DEFAULT_OUTPUT_ESTIMATE) if mean is None else mean
            output = max(floor, route_mean or 0.0)
        if context_left is not None:
            output = min(output, float(max(0, context_left)))
        return key.limits.cost(prompt, cached, 0) + output

    def admit(
        self, key: ClientKey, estimate: float, now: float, prompt: int = 0, cached: int = 0
    ) -> Reservation:
        """Reserve `estimate` for a request of `key` (`prompt` tokens expected, `cached` of
        them cached), or raise OverLimit naming the limit and when to try again. Nothing is
        reserved when it raises."""
        limits, name = key.limits, key.name
        state = self._state(name)
        day, month = period_ids(now)
        if state.day.period != day:
            state.day.roll(day)
        if state.month.period != month:
            state.month.roll(month)
        fraction = self.share.fraction() if limits.any else 1.0
        rpm = tpm = 0.0
        if limits.any:
            rpm, tpm = self._check(key, state, estimate, now, fraction)
        # Taken only once every limit said yes: a refusal reserves nothing.
        if limits.rpm is not None:
            state.rpm.set(rpm - 1, now)
        if limits.tpm is not None:
            state.tpm.set(tpm - estimate, now)
        state.in_flight += 1
        state.day.reserved += estimate
        state.month.reserved += estimate
        minute = state.minute
        minute.append((now, estimate))
        while minute[0][0] <= now - _MINUTE:  # what "this minute" shows, and no more
            minute.popleft()
        state.requests += 1
        return Reservation(self, name, limits, estimate, day, month, prompt, cached)

    def _check(
        self, key: ClientKey, state: _State, estimate: float, now: float, fraction: float
    ) -> tuple[float, float]:
        """Raise OverLimit for the first limit the request does not fit; the rpm and tpm
        buckets' levels now (0 for a limit not set)."""
        limits = key.limits
        rpm = tpm = 0.0
        if limits.max_in_flight is not None:
            cap = max(1, self.share.part(limits.max_in_flight))
            if state.in_flight >= cap:
                self._refuse(key, state, "max_in_flight", 1.0, now,
                             f"{limits.max_in_flight} requests in flight at most")  # fmt: skip
        if limits.rpm is not None:
            cap = limits.rpm * fraction
            rpm = state.rpm.now(cap, now)
            # A share under one request a minute (rpm below the live instances) never holds
            # one: a request then runs when the bucket is full, as a large one does on tpm,
            # and the bucket refills at the share (rpm 1 on two: one each two minutes).
            need = min(1.0, cap)
            if rpm < need - _DUST:
                wait = (need - rpm) / (cap / _MINUTE)
                self._refuse(key, state, "rpm", wait, now, f"{limits.rpm} requests a minute")
        if limits.tpm is not None:
            cap = limits.tpm * fraction
            tpm = state.tpm.now(cap, now)
            # A request larger than the whole bucket runs when the bucket is full; every
            # request needs one token at least (its cost is known only when it ends).
            need = min(max(estimate, 1.0), cap)
            if tpm < need - _DUST:
                wait = (need - tpm) / (cap / _MINUTE)
                self._refuse(key, state, "tpm", wait, now, f"{limits.tpm} tokens a minute")
        for kind, budget, spent, until in (
            ("tokens_per_day", limits.tokens_per_day, state.day, _until_next_day),
            ("tokens_per_month", limits.tokens_per_month, state.month, _until_next_month),
        ):
            if budget is None:
                continue
            room = spent.room(budget, fraction)
            if room > 0 and (room >= estimate or spent.reserved == 0):
                continue
            wait = until(now) if spent.used() >= budget else _SYNC_RETRY
            self._refuse(key, state, kind, wait, now, f"a budget of {budget} tokens")
        return rpm, tpm

    def _refuse(
        self, key: ClientKey, state: _State, kind: str, wait: float, now: float, what: str
    ) -> None:
        state.limited[kind] += 1
        wait = max(1.0, wait)
        error = OverLimit(
            key.name,
            kind,
            wait,
            f"key {key.name!r} is over its limit of {what} ({kind}); "
            f"try again in {max(1, math.ceil(wait))} s",
        )
        if now - state.logged_at >= _LOG_EVERY:
            state.logged_at = now
            log.warn(
                "key {key} over its {limit} limit; refusing its requests with 429 "
                "(said once a minute; {n} refused so far)",
                key=key.name,
                limit=kind,
                n=sum(state.limited.values()),
            )
        for listener in self.listeners:
            listener(error)
        raise error

    # -- settlement

    def _settle(self, r: Reservation, cost: float, now: float, completion: int | None) -> float:
        """`r` cost `cost`; `completion`, when not None, teaches the key's mean."""
        state = self._state(r.name)
        state.in_flight = max(0, state.in_flight - 1)
        if r.limits.tpm is not None:
            cap = r.limits.tpm * self.share.fraction()
            state.tpm.take(cost - r.estimate, cap, now)
        for budget, period in ((state.day, r.day), (state.month, r.month)):
            if budget.period == period:
                budget.reserved = max(0.0, budget.reserved - r.estimate)
                budget.spent += cost
            else:  # the period turned while it ran: it counts where it ended
                day, month = period_ids(now)
                budget.roll(day if period.startswith("d") else month)
                budget.spent += cost
        state.minute.append((now, cost - r.estimate))
        if completion is not None:
            mean = state.completion_mean
            state.completion_mean = (
                float(completion) if mean is None else mean + _MEAN_WEIGHT * (completion - mean)
            )
        return cost

    def _spend(self, r: Reservation, cost: float, now: float) -> None:
        """`r`'s key spent `cost` more than it reserved: a run that answered nothing."""
        state = self._state(r.name)
        if r.limits.tpm is not None:
            state.tpm.take(cost, r.limits.tpm * self.share.fraction(), now)
        day, month = period_ids(now)
        for budget, period in ((state.day, day), (state.month, month)):
            if budget.period != period:
                budget.roll(period)
            budget.spent += cost
        state.minute.append((now, cost))

    # -- several instances

    def pending(self) -> list[tuple[str, str, float]]:
        """(key, period, spent) of this instance for every key that spent in the current
        periods: what a sync writes."""
        rows = []
        for name, state in self._states.items():
            for budget in (state.day, state.month):
                if budget.period and budget.spent > 0:
                    rows.append((name, budget.period, budget.spent))
        return rows

    def synced(self, written: list[tuple[str, str, float]], others: dict[tuple[str, str], float]):
        """A sync wrote `written` (from `pending`) and read the other instances' spending per
        (key, period)."""
        wrote = {(name, period): spent for name, period, spent in written}
        for name, state in self._states.items():
            for budget in (state.day, state.month):
                if not budget.period:
                    continue
                budget.others = others.get((name, budget.period), 0.0)
                if (name, budget.period) in wrote:
                    budget.synced = wrote[(name, budget.period)]
        for (name, period), spent in others.items():
            if name not in self._states:  # spent elsewhere, not seen here yet
                state = self._state(name)
                budget = state.day if period.startswith("d") else state.month
                budget.roll(period)
                budget.others = spent

    # -- what it shows

    def status(self, key: ClientKey, now: float) -> dict[str, Any]:
        """What the key used: this minute (this instance), today and this month (all
        instances, as of the last sync), in flight, and its refusals by limit."""
        state = self._state(key.name)
        day, month = period_ids(now)
        state.day.roll(day)
        state.month.roll(month)
        while state.minute and state.minute[0][0] <= now - _MINUTE:
            state.minute.popleft()
        return {
            "in_flight": state.in_flight,
            "requests": state.requests,
            "tokens_this_minute": round(sum(cost for _, cost in state.minute), 1),
            "tokens_today": round(state.day.used(), 1),
            "tokens_this_month": round(state.month.used(), 1),
            "limited": dict(state.limited),
        }

    def limited(self) -> dict[str, Counter[str]]:
        """Refusals by key and limit, since start (for the metrics)."""
        return {name: state.limited for name, state in self._states.items() if state.limited}

    def mean_completion(self, name: str) -> float | None:
        state = self._states.get(name)
        return None if state is None else state.completion_mean
