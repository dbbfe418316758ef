"""Rolling the usage rows up into per-minute sums (run in the store's thread): the sweep's
`Store.roll_up`. See schema/003-usage-rollups.sql for the tables."""

from __future__ import annotations

from attrs import frozen
from twisted.enterprise.adbapi import Transaction

from crossbar.store.backends import SQLITE, Backend
from crossbar.store.reports import rollup_bounds

# A row is written when its request finishes, in a group commit, perhaps after a store outage:
# a minute is summed only once it is this far in the past, so its rows have all arrived.
ROLLUP_LAG = 300.0
# At most this much time is summed per roll-up (one sweep): a store upgraded with a month of
# raw rows catches up over many sweeps, each a short transaction, never one that holds the
# store's writes for minutes. Reports stay right meanwhile (raw rows go only once summed).
ROLLUP_STEP = 3600.0


@frozen
class RolledUp:
    """What one roll-up did: minute rows written, raw rows deleted, and whether every whole
    minute up to the lag is summed now (False: more next time)."""

    minutes: int
    deleted: int
    caught_up: bool


_COLUMNS = (
    "route, host, model, key, requests, errors, prompt_tokens, cached_tokens, completion_tokens"
)
_ADD = ", ".join(
    f"{c} = {{table}}.{c} + excluded.{c}"
    for c in ("requests", "errors", "prompt_tokens", "cached_tokens", "completion_tokens")
)


def roll_up(txn: Transaction, backend: Backend, now: float, raw_before: float) -> RolledUp:
    """Sum the raw rows of every whole minute up to `now - ROLLUP_LAG` not summed yet into
    usage_minutes (at most ROLLUP_STEP of time at once), and the whole hours of those into
    usage_hours; then delete the raw rows before `raw_before` (never one not summed). One
    transaction; a second instance doing the same waits for the row lock, then
    finds the work done."""
    if backend.begin_write:
        txn.execute(backend.begin_write)
    txn.execute("UPDATE usage_rollup SET rolled_until = rolled_until")  # the lock, on both
    b = rollup_bounds(txn)
    rolled_until, hours_until, raw_from = b.rolled_until, b.hours_until, b.raw_from
    cutoff = target = ((now - ROLLUP_LAG) // 60) * 60
    if rolled_until == 0:  # never rolled up: start at the oldest row, not at 1970
        txn.execute("SELECT MIN(at) FROM usage")
        (oldest,) = txn.fetchone()
        rolled_until = hours_until = (float(oldest) // 3600) * 3600 if oldest is not None else 0.0
    if rolled_until:
        cutoff = min(cutoff, rolled_until + ROLLUP_STEP)
    written = 0
    if cutoff > rolled_until:
        minute = "CAST(at / 60 AS INTEGER) * 60" if backend is SQLITE else "FLOOR(at / 60) * 60"
        sums = (
            "COUNT(*), SUM(CASE WHEN status >= 400 OR error <> '' THEN 1 ELSE 0 END), "
            "SUM(prompt_tokens), SUM(cached_tokens), SUM(completion_tokens)"
        )
        txn.execute(
            backend.sql(
                f"INSERT INTO usage_minutes (minute, {_COLUMNS}) "
                f"SELECT {minute} AS m, route, host, model, key, {sums} "
                "FROM usage WHERE at >= ? AND at < ? GROUP BY m, route, host, model, key "
                "ON CONFLICT (minute, route, host, model, key) DO UPDATE SET "
                + _ADD.format(table="usage_minutes")
            ),
            (rolled_until, cutoff),
        )
        written = max(txn.rowcount, 0)
        rolled_until = cutoff
    hour_cutoff = (rolled_until // 3600) * 3600
    if hour_cutoff > hours_until:
        hour = (
            "CAST(minute / 3600 AS INTEGER) * 3600"
            if backend is SQLITE
            else ("FLOOR(minute / 3600) * 3600")
        )
        txn.execute(
            backend.sql(
                f"INSERT INTO usage_hours (hour, {_COLUMNS}) "
                f"SELECT {hour} AS h, route, host, model, key, SUM(requests), SUM(errors), "
                "SUM(prompt_tokens), SUM(cached_tokens), SUM(completion_tokens) "
                "FROM usage_minutes WHERE minute >= ? AND minute < ? "
                "GROUP BY h, route, host, model, key "
                "ON CONFLICT (hour, route, host, model, key) DO UPDATE SET "
                + _ADD.format(table="usage_hours")
            ),
            (hours_until, hour_cutoff),
        )
        hours_until = hour_cutoff
    deleted = 0
    before = min(raw_before, rolled_until)
    if before > raw_from:
        txn.execute(backend.sql("DELETE FROM usage WHERE at < ?"), (before,))
        deleted = txn.rowcount
        raw_from = before
    txn.execute(
        backend.sql("UPDATE usage_rollup SET rolled_until = ?, hours_until = ?, raw_from = ?"),
        (rolled_until, hours_until, raw_from),
    )
    return RolledUp(written, deleted, rolled_until >= target)
