"""The figures of bench/proxy/slot_handoff.py, from what the one-slot host and crossbar's stamps
recorded: each hand-off (the slot's idle time between two answers, the next request's first
byte), their spread, and crossbar's part of each split at its stamps.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bench.common.measure import percentile

PERCENTILES = ("p50", "p90", "p99", "max")  # a Spread's fields, in the tables' order


@dataclass(frozen=True)
class Handoff:
    """One hand-off: the host's slot idle from answer k's end to taking request k+1, the
    first byte of request k+1 after answer k's end (negative: it was at the host already), both
    in nanoseconds, and whether request k+1 came on the connection answer k ended on."""

    idle_ns: int
    first_byte_ns: int
    same_connection: bool
    ended: int = 0  # answer k's end (monotonic ns)


def handoffs(records: Iterable[Mapping[str, Any]], sent: Mapping[str, int]) -> list[Handoff]:
    """The hand-offs among the host's `records` (in the slot's order; each with `id`,
    `connection`, `arrived`, `taken`, `ended`): every two answers k, k+1 whose request k+1 was
    sent (`sent`: bench id -> the client's monotonic ns) before answer k ended. A record whose
    id was not sent in this round (a warm-up's) is no part of any pair."""
    out = []
    previous: Mapping[str, Any] | None = None
    for record in records:
        at = sent.get(record["id"])
        if at is None:
            previous = None
            continue
        if previous is not None and at < previous["ended"]:
            out.append(
                Handoff(
                    idle_ns=record["taken"] - previous["ended"],
                    first_byte_ns=record["arrived"] - previous["ended"],
                    same_connection=record["connection"] == previous["connection"],
                    ended=previous["ended"],
                )
            )
        previous = record
    return out


@dataclass(frozen=True)
class Spread:
    """Nearest-rank percentiles and the maximum of a list of microseconds; n how many."""

    n: int
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values_us: list[float]) -> Spread:
        """The spread of `values_us` (all zero for none)."""
        if not values_us:
            return cls(0, 0.0, 0.0, 0.0, 0.0)
        return cls(
            len(values_us),
            percentile(values_us, 50),
            percentile(values_us, 90),
            percentile(values_us, 99),
            max(values_us),
        )


SEGMENTS = (
    ("woke", "crossbar's epoll_wait returns"),
    ("host_data", "the answer's bytes reach HostConnection.dataReceived"),
    ("ended", "llhttp has read the answer whole; its connection is back in the pool"),
    ("finish", "the relay ends: Request.finish begins"),
    ("finished", "Request.finish returns (the client's answer written)"),
    ("admit", "release(): Limiter._admit begins"),
    ("attempt", "the waiter resumed: Upstream._attempt begins"),
    ("request", "head built, kept connection taken: HostConnection.request begins"),
    ("arrived", "sendmsg, and the host has read the request's first byte"),
)


Stamp = tuple[str, int, int]  # label, monotonic ns, the reactor thread's CPU ns


@dataclass
class Breakdown:
    """Per segment of SEGMENTS, one value per hand-off: the microseconds from the stamp before
    (`wall`), and of them those crossbar's reactor thread ran (`cpu`: for the segments between
    two of crossbar's stamps only); `skipped`: hand-offs that lacked a stamp."""

    wall: dict[str, list[float]]
    cpu: dict[str, list[float]]
    skipped: int = 0


def breakdown(windows: Iterable[tuple[int, int]], stamps: Iterable[Stamp]) -> Breakdown:
    """Where each hand-off window went (`ended` of answer k, `arrived` of request k+1 at the
    host, monotonic ns), by crossbar's stamps within it: the first `ended`, the last
    `host_data` before it, the last `woke` before that (none in the window: crossbar was awake
    already, and that segment is 0), then the first `admit` after it, the `finish` and
    `finished` between the two (none: the slot was freed before the relay ended, and those
    segments are 0), and the first `attempt` and `request` after the `admit`."""
    ordered = sorted(stamps, key=lambda s: s[1])
    times = [s[1] for s in ordered]
    found = Breakdown({label: [] for label, _ in SEGMENTS}, {label: [] for label, _ in SEGMENTS})
    for start, arrived in windows:
        inside = ordered[bisect_right(times, start) : bisect_left(times, arrived)]
        walked = _walk(inside)
        if walked is None:
            found.skipped += 1
            continue
        woke, *rest = walked
        at = [start, start if woke is None else woke[1], *(s[1] for s in rest), arrived]
        for (label, _), before, after in zip(SEGMENTS, at[:-1], at[1:], strict=True):
            found.wall[label].append((after - before) / 1000)
        ran = [woke, *rest]
        for (label, _), before, after in zip(SEGMENTS[1:-1], ran[:-1], ran[1:], strict=True):
            if before is not None and after is not None:
                found.cpu[label].append((after[2] - before[2]) / 1000)
    return found


def _walk(inside: list[Stamp]) -> list[Stamp | None] | None:
    """One window's stamps in SEGMENTS' order, `arrived` left out (see `breakdown`): `woke`
    may be None; None when another is missing."""
    labels = [s[0] for s in inside]
    if "ended" not in labels:
        return None
    end = labels.index("ended")
    data = max((i for i in range(end) if labels[i] == "host_data"), default=None)
    if data is None:
        return None
    woke = max((i for i in range(data) if labels[i] == "woke"), default=None)
    found: list[Stamp | None] = [None if woke is None else inside[woke], inside[data], inside[end]]
    admit = _next(labels, "admit", end)
    if admit < 0:
        return None
    # A crossbar that frees the slot before the relay ends finishes the request after the
    # hand-off: those two segments are then empty.
    finish = _next(labels, "finish", end, admit)
    finished = _next(labels, "finished", finish, admit) if finish >= 0 else -1
    if finished < 0:
        finish = finished = end
    found += [inside[finish], inside[finished], inside[admit]]
    i = admit
    for label in ("attempt", "request"):
        i = _next(labels, label, i)
        if i < 0:
            return None
        found.append(inside[i])
    return found


def _next(labels: list[str], label: str, after: int, before: int | None = None) -> int:
    """The index of the first `label` after index `after` (and before `before`), or -1."""
    end = len(labels) if before is None else before
    return next((j for j in range(after + 1, end) if labels[j] == label), -1)
