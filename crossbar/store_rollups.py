"""Rolling the usage rows up into per-minute sums (run in the store's thread): the sweep's
`Store.roll_up`. See schema/003-usage-rollups.sql for the tables."""

from __future__ import annotations

from twisted.enterprise.adbapi import Transaction

from crossbar.backends import SQLITE, Backend
from crossbar.store_queries import rollup_bounds

# A row is written when its request finishes, in a group commit, perhaps after a store outage:
# a minute is summed only once it is this far in the past, so its rows have all arrived.
ROLLUP_LAG = 300.0


def roll_up(txn: Transaction, backend: Backend, now: float, raw_before: float) -> tuple[int, int]:
    """Sum the raw rows of every whole minute up to `now - ROLLUP_LAG` not summed yet into
    usage_minutes, then delete the raw rows before `raw_before` (never one not summed). Returns
    (minute rows written, raw rows deleted). One transaction; a second instance doing the same
    waits for the row lock and then finds the minutes done."""
    if backend.begin_write:
        txn.execute(backend.begin_write)
    txn.execute("UPDATE usage_rollup SET rolled_until = rolled_until")  # the lock, on both
    rolled_until, raw_from = rollup_bounds(txn)
    cutoff = ((now - ROLLUP_LAG) // 60) * 60
    written = 0
    if cutoff > rolled_until:
        minute = "CAST(at / 60 AS INTEGER) * 60" if backend is SQLITE else "FLOOR(at / 60) * 60"
        txn.execute(
            backend.sql(
                "INSERT INTO usage_minutes (minute, route, host, model, requests, errors, "
                "prompt_tokens, cached_tokens, completion_tokens) "
                f"SELECT {minute} AS m, route, host, model, COUNT(*), "
                "SUM(CASE WHEN status >= 400 OR error <> '' THEN 1 ELSE 0 END), "
                "SUM(prompt_tokens), SUM(cached_tokens), SUM(completion_tokens) "
                "FROM usage WHERE at >= ? AND at < ? GROUP BY m, route, host, model "
                "ON CONFLICT (minute, route, host, model) DO UPDATE SET "
                "requests = usage_minutes.requests + excluded.requests, "
                "errors = usage_minutes.errors + excluded.errors, "
                "prompt_tokens = usage_minutes.prompt_tokens + excluded.prompt_tokens, "
                "cached_tokens = usage_minutes.cached_tokens + excluded.cached_tokens, "
                "completion_tokens = usage_minutes.completion_tokens + excluded.completion_tokens"
            ),
            (rolled_until, cutoff),
        )
        written = max(txn.rowcount, 0)
        rolled_until = cutoff
    deleted = 0
    before = min(raw_before, rolled_until)
    if before > raw_from:
        txn.execute(backend.sql("DELETE FROM usage WHERE at < ?"), (before,))
        deleted = txn.rowcount
        raw_from = before
    txn.execute(
        backend.sql("UPDATE usage_rollup SET rolled_until = ?, raw_from = ?"),
        (rolled_until, raw_from),
    )
    return written, deleted
