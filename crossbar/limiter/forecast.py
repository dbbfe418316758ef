"""How long the work on a (host, model)'s slots will take, at the host's pace (docs/reference.md,
"Slots": rates and the expected wait): what one request holds its slot for, what a running one
has left, and the queue played forward on the slots (each waiter takes the slot that frees
first). Pure arithmetic on `Work` and a pace `(prefill rate, decode rate, overhead)`; the
limiter (slots.py) feeds it what runs and waits."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from crossbar.limiter.types import Work

Pace = tuple[float, float, float]  # prefill tokens/s, decode tokens/s of one slot, overhead s


def cost(work: Work, pace: Pace) -> float:
    """Seconds a request holds its slot: its overhead, its prefill, then its output."""
    prefill, decode, overhead = pace
    return overhead + work.prefill / prefill + work.output / decode


def remaining(work: Work, now: float, pace: Pace, factor: float = 1.0) -> float:
    """Seconds until a running request ends: its output left at the decode rate once it
    streams, else its whole expected hold (its cost x the host's `factor`) less the time it
    has run; at least one token's time (it has not ended yet)."""
    decode = pace[1]
    streamed = work.streamed()
    if streamed > 0:
        left = (work.output - streamed) / decode
    else:
        started = now if work.started is None else work.started
        left = factor * cost(work, pace) - (now - started)
    return max(left, 1 / decode)


def first_free(
    running: Iterable[Work],
    ahead: Sequence[Work],
    limit: int,
    now: float,
    pace: Pace,
    factor: float,
) -> float:
    """Seconds until a slot frees for one more request, `ahead` of it waiting: what runs ends
    (requests beyond `limit`, tracked or a shrink, after the first to end), then each waiter
    ahead takes the slot that frees first."""
    frees = [remaining(w, now, pace, factor) for w in running]
    frees += [0.0] * max(0, limit - len(frees))
    heapq.heapify(frees)
    while len(frees) > limit:
        first = heapq.heappop(frees)
        heapq.heapreplace(frees, frees[0] + first)
    for work in ahead:
        heapq.heapreplace(frees, frees[0] + factor * cost(work, pace))
    return frees[0]


def all_done(
    running: Iterable[Work],
    waiting: Iterable[Work | None],
    limit: int,
    now: float,
    pace: Pace,
    factor: float,
) -> float:
    """Seconds until everything running and `waiting` (None: a waiter of unknown work, which
    takes no time) is done, played forward on `limit` slots."""
    frees = sorted(remaining(w, now, pace, factor) for w in running)
    ends = list(frees)
    frees = (frees + [0.0] * limit)[:limit]
    heapq.heapify(frees)
    for work in waiting:
        end = heapq.heappop(frees) + (factor * cost(work, pace) if work is not None else 0.0)
        ends.append(end)
        heapq.heappush(frees, end)
    return max(ends, default=0.0)
