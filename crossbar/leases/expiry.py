"""Which leases the sweep expires, in bounded batches (table.py `Table.expire_idle`).

Expiring every idle lease in one transaction and one pass over memory stalled the reactor for
0.8 s at 99k leases, and every request that needed the store waited behind it. Here the leases
are scanned in slices with the reactor free between them, and handed out in batches of at
most `batch`, each its own transaction: a request waits for one batch at most.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from crossbar.leases.types import Key, Lease

SCAN_SLICE = 10_000  # leases looked at between two pauses of the scan


async def idle_batches(
    leases: Sequence[Lease],
    idle_before: float,
    batch: int,
    current: Callable[[Key], Lease | None],
    pause: Callable[[], Awaitable[object]],
) -> AsyncIterator[list[Lease]]:
    """Batches of at most `batch` (0: no bound) of `leases` last used before `idle_before`.

    Each is checked again just before it is handed out: a lease used meanwhile (its
    `last_used` moved on) or replaced in memory (`current(key)` is another object) is spared.
    Between slices of SCAN_SLICE leases the scan awaits `pause()`."""
    limit = batch if batch > 0 else max(len(leases), 1)
    found: list[Lease] = []
    for start in range(0, len(leases), SCAN_SLICE):
        if start:
            await pause()
        for lease in leases[start : start + SCAN_SLICE]:
            if lease.last_used < idle_before:
                found.append(lease)
                if len(found) >= limit:
                    yield _still_idle(found, idle_before, current)
                    found = []
    if found:
        yield _still_idle(found, idle_before, current)


def _still_idle(
    leases: list[Lease], idle_before: float, current: Callable[[Key], Lease | None]
) -> list[Lease]:
    return [x for x in leases if x.last_used < idle_before and current(x.key) is x]
