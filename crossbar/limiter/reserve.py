"""The request classes' rules over one (host, model)'s slots (docs/reference.md, "Slots":
classes): the slots batch leaves the turns (the cap following the turns' recent peak), the
aging that keeps every class moving, and which running batch request a waiting turn stops.

Pure functions of a `SlotEntry` and the time they are given: the limiter (slots.py) keeps the
timers and calls them where slots and waiters change.
"""

from __future__ import annotations

from crossbar.config import RANK, RouteLimits
from crossbar.limiter.types import SlotEntry, Work

BATCH_RANK, STANDARD_RANK, INTERACTIVE_RANK = RANK["batch"], RANK["standard"], RANK["interactive"]
# How long the most turns (interactive and standard requests) a (host, model) held at once are
# kept from batch after they were seen: an agent thinks (runs its tools) between two turns, and
# its next turn should find its slot still free.
RESERVE_WINDOW = 10.0


def turns_recent(slots: SlotEntry, now: float) -> int:
    """The most interactive and standard requests `slots` held at once lately."""
    if now - slots.turns_peak_at < RESERVE_WINDOW:
        return slots.turns_peak
    return 0


def note_turns(slots: SlotEntry, klass: int, now: float) -> None:
    """A request of `klass` took a slot: a new peak of the turns held at once."""
    if klass == BATCH_RANK:
        return
    held = slots.by_class[STANDARD_RANK] + slots.by_class[INTERACTIVE_RANK]
    if held >= turns_recent(slots, now):
        slots.turns_peak, slots.turns_peak_at = held, now


def batch_cap(slots: SlotEntry, limits: RouteLimits, rank: int, limit: int, now: float) -> int:
    """The slots of `limit` batch may hold: the route's `batch_slots` when it sets them; else
    what the other classes leave: every slot but the most interactive and standard requests
    held at once within RESERVE_WINDOW (or running and waiting now), at least one slot left
    them; every slot but one while none came. A batch waiter aged to the top class may take
    one slot whatever they hold: no batch waits for ever."""
    if limits.batch_slots is not None:
        return limits.batch_slots
    by, waiting = slots.by_class, slots.waiting_by_class
    turns = by[STANDARD_RANK] + by[INTERACTIVE_RANK]
    turns += waiting[STANDARD_RANK] + waiting[INTERACTIVE_RANK]
    recent = max(turns, turns_recent(slots, now))
    cap = max(1, limit - 1) if recent == 0 else max(0, limit - recent)
    return max(cap, 1) if rank >= INTERACTIVE_RANK else cap


def wake_at(slots: SlotEntry, limit: int, aging: float, now: float) -> float | None:
    """When batch waiting beside a free slot may rise to it by time alone (the turns' window
    passes, a batch waiter ages a class), with no release or arrival to say so; None when no
    batch waits so."""
    if not slots.waiting_by_class[BATCH_RANK] or slots.in_flight >= limit:
        return None
    due = [slots.turns_peak_at + RESERVE_WINDOW]
    if aging > 0:
        due += [
            w.enqueued + (w.rank - w.klass + 1) * aging
            for w in slots.waiters
            if w.klass == BATCH_RANK and w.rank < INTERACTIVE_RANK
        ]
    later = [t for t in due if t > now]
    return min(later) if later else None


def yield_at(slots: SlotEntry) -> float | None:
    """When the oldest waiting turn will have waited the shortest bound of a running batch
    request that may be stopped for it (its route's `batch_yield_after`); None: none may."""
    if not (slots.waiting_by_class[INTERACTIVE_RANK] or slots.waiting_by_class[STANDARD_RANK]):
        return None
    bounds = [w.yield_after for w in slots.running if w.stop is not None]
    if not bounds:
        return None
    oldest = min(w.enqueued for w in slots.waiters if w.klass != BATCH_RANK)
    return oldest + min(b for b in bounds if b is not None)


def to_stop(slots: SlotEntry, now: float) -> Work | None:
    """The batch request to stop for the turns waiting now: of those whose bound the oldest
    turn has waited, the one that started last (the least work lost); None when none."""
    turns = [w.enqueued for w in slots.waiters if w.klass != BATCH_RANK]
    if not turns:
        return None
    waited = now - min(turns)
    stoppable = [
        w
        for w in slots.running
        if w.stop is not None and w.yield_after is not None and waited >= w.yield_after
    ]
    return max(stoppable, key=lambda w: w.started or 0.0) if stoppable else None


def age(slots: SlotEntry, aging: float, now: float) -> None:
    """Raise each waiter one class for every `aging` seconds it has waited, so no class waits
    for ever behind a higher one. Only the order among waiters of different classes can
    change, so a queue of one class is left as it is (raised later, when a higher class joins
    it, a waiter takes the place its wait earned); but a batch waiter's class also decides its
    cap (`batch_cap`), so a queue holding one is aged always."""
    waiters = slots.waiters
    if aging <= 0 or not (waiters.mixed() or slots.waiting_by_class[BATCH_RANK]):
        return
    for waiter in waiters.below(INTERACTIVE_RANK):
        rank = min(INTERACTIVE_RANK, waiter.klass + int((now - waiter.enqueued) // aging))
        if rank > waiter.rank:
            waiters.raise_to(waiter, rank)
