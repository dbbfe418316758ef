"""The operator's view of the Batch API (`/api/batches`, docs/reference.md "Admin API"): every
route's and key's batches, newest first, each as its client sees it (OpenAI's batch object) with
its route, key, progress, items by state, tokens and an estimate of when it ends; one batch with
its events; a cancel, the same as the client's own.

The estimate is the pace so far carried forward: the items left over the items ended per second
since the batch went in progress. It knows nothing of the fleet's other work (a batch runs on
the slots people leave), so it moves with them.
"""

from __future__ import annotations

from typing import Any

from attrs import asdict
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from crossbar.batches import batch_object, not_run_line
from crossbar.store import BATCH_ENDED, BATCH_STATUSES, BatchRow, Store
from crossbar.wire import bad_request, not_found

log = Logger(namespace="crossbar.admin")

MAX_BATCHES = 1000  # batches in one answer
MAX_BATCH_EVENTS = 1000


def eta_seconds(row: BatchRow, now: float) -> float | None:
    """Seconds until the batch's items have all ended, at the pace they have ended since it
    went in progress: items left / ((done + failed) / (now - in_progress_at)). None before any
    item ended, and once the batch has ended."""
    counts = row.counts
    ended = counts.done + counts.failed
    elapsed = now - row.in_progress_at
    if row.status in BATCH_ENDED or not ended or not row.in_progress_at or elapsed <= 0:
        return None
    return round(max(0, row.total - ended) * elapsed / ended, 1)


def batch_view(row: BatchRow, now: float) -> dict[str, Any]:
    """A batch as the admin API shows it: OpenAI's batch object, then whose it is (`route`,
    `key`: "" for a route's own key or none), `progress` (items ended of the total), `items` by
    state, `tokens` and `eta_seconds`."""
    counts = row.counts
    return {
        **batch_object(row),
        "route": row.route,
        "key": row.key,
        "progress": {"ended": counts.done + counts.failed, "total": row.total},
        "items": {
            "pending": counts.pending,
            "running": counts.running,
            "done": counts.done,
            "failed": counts.failed,
        },
        "tokens": {
            "prompt": counts.prompt_tokens,
            "cached": counts.cached_tokens,
            "completion": counts.completion_tokens,
        },
        "eta_seconds": eta_seconds(row, now),
    }


class BatchViews:
    """What `/api/batches` answers, read from the store on the reports' connection."""

    def __init__(self, clock: IReactorTime, store: Store) -> None:
        self._clock = clock
        self._store = store

    async def page(
        self, route: str | None, key: str | None, status: str | None, after: str | None, limit: int
    ) -> dict[str, Any]:
        """Up to `limit` batches newest first (of `route`, `key`, `status` when given), after
        the batch `after`; `next` is the id to pass as `after` for the next page, or None."""
        if status is not None and status not in BATCH_STATUSES:
            raise bad_request(f"status: must be one of {', '.join(BATCH_STATUSES)}, not {status!r}")
        rows = await self._store.batch_page(route, key, status, after or "", limit + 1)
        now = self._clock.seconds()
        shown = rows[:limit]
        more = len(rows) > limit
        return {
            "batches": [batch_view(r, now) for r in shown],
            "next": shown[-1].id if more else None,
        }

    async def show(self, batch_id: str, events: int) -> dict[str, Any]:
        """One batch with its latest `events` events, newest first; 404 for no such batch."""
        row, found = await self._store.batch_report(batch_id, events)
        if row is None:
            raise not_found(f"no batch {batch_id!r}")
        return {**batch_view(row, self._clock.seconds()), "events": [asdict(e) for e in found]}

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        """Cancel a batch as its client would: the items not run end in its error file, those
        running finish, then it is `cancelled`. A batch past cancelling is left as it is. The
        batch after; 404 for no such batch."""
        status = await self._store.cancel_batch(batch_id, self._clock.seconds(), not_run_line)
        if status is None:
            raise not_found(f"no batch {batch_id!r}")
        if status == "cancelling":
            log.info("batch {id} cancelling (by the operator)", id=batch_id)
        row = await self._store.read_batch(batch_id)
        if row is None:  # pruned meanwhile
            raise not_found(f"no batch {batch_id!r}")
        return batch_view(row, self._clock.seconds())
