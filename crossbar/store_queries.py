"""The store's usage reports, written once for SQLite and PostgreSQL alike (run in the store's
thread).

A report over a window the raw rows still cover (`since` at or after `raw_from`) reads the raw
rows alone. An older window reads the per-minute sums (usage_minutes) before `rolled_until` and
the raw rows from there on; the TTFB percentiles, which cannot be summed, come from the raw
rows the window still has (the last server.usage_raw_retention). Every range read is on an
index: usage (at) and usage_minutes' primary key, which starts with the minute.
"""

from __future__ import annotations

from typing import Any

from twisted.enterprise.adbapi import Transaction

from crossbar.backends import SQLITE, Backend

_NAMES = ("requests", "errors", "prompt_tokens", "cached_tokens", "completion_tokens")
_RAW_SUMS = """COUNT(*), SUM(CASE WHEN status >= 400 OR error <> '' THEN 1 ELSE 0 END),
               SUM(prompt_tokens), SUM(cached_tokens), SUM(completion_tokens)"""
_MINUTE_SUMS = """SUM(requests), SUM(errors), SUM(prompt_tokens), SUM(cached_tokens),
                  SUM(completion_tokens)"""


def rollup_bounds(txn: Transaction) -> tuple[float, float]:
    """(rolled_until, raw_from): raw rows before the first are summed in usage_minutes; raw
    rows are kept from the second on."""
    txn.execute("SELECT rolled_until, raw_from FROM usage_rollup")
    rolled_until, raw_from = txn.fetchone()
    return float(rolled_until), float(raw_from)


def _parts(
    txn: Transaction, since: float | None
) -> tuple[tuple[str, tuple], tuple[str, tuple] | None, float]:
    """The raw rows' WHERE and the minutes' WHERE (None: raw rows alone answer) of a window,
    and where the raw rows still kept begin (for percentiles)."""
    rolled_until, raw_from = rollup_bounds(txn)
    start = since if since is not None else float("-inf")
    if since is not None and since >= raw_from:
        return (" WHERE at >= ?", (since,)), None, since
    minute = (start // 60) * 60 if since is not None else -1.0
    raw = (" WHERE at >= ?", (max(start, rolled_until),))
    return raw, (" WHERE minute >= ? AND minute < ?", (minute, rolled_until)), max(start, raw_from)


def usage_totals_rows(
    txn: Transaction, backend: Backend, by: str, since: float | None, percentiles: bool = True
) -> list[dict[str, Any]]:
    """Totals per `by` (a column name the caller checked: never client text)."""
    (raw_where, raw_args), minutes, kept_from = _parts(txn, since)
    sql = f"SELECT {by}, {_RAW_SUMS} FROM usage{raw_where} GROUP BY {by}"
    args: tuple = raw_args
    if minutes is not None:
        sql += f" UNION ALL SELECT {by}, {_MINUTE_SUMS} FROM usage_minutes{minutes[0]}"
        sql += f" GROUP BY {by}"
        args += minutes[1]
    txn.execute(backend.sql(f"SELECT * FROM ({sql}) parts"), args)
    totals: dict[str, list[int]] = {}
    for key, *values in txn.fetchall():
        sums = totals.setdefault(key, [0] * len(_NAMES))
        for i, value in enumerate(values):
            sums[i] += int(value or 0)
    pct = _percentiles(txn, backend, by, kept_from) if percentiles else {}
    return [
        {
            by: key,
            **dict(zip(_NAMES, totals[key], strict=True)),
            "ttfb_p50_ms": pct.get(key, (None, None))[0],
            "ttfb_p95_ms": pct.get(key, (None, None))[1],
        }
        for key in sorted(totals)
    ]


def _percentiles(
    txn: Transaction, backend: Backend, by: str, since: float
) -> dict[str, tuple[float | None, float | None]]:
    """Nearest-rank p50 and p95 of the time to first byte per `by`, over the raw rows."""
    where, args = ("", ()) if since == float("-inf") else (" AND at >= ?", (since,))
    sql = f"""
        WITH ranked AS (
            SELECT {by} AS k, ttfb_ms AS v,
                   ROW_NUMBER() OVER (PARTITION BY {by} ORDER BY ttfb_ms) AS rn,
                   COUNT(*) OVER (PARTITION BY {by}) AS n
            FROM usage WHERE ttfb_ms IS NOT NULL{where})
        -- nearest rank: the ceil(p * n)-th smallest, in integer arithmetic
        SELECT k, MIN(CASE WHEN rn = (n + 1) / 2 THEN v END),
                  MIN(CASE WHEN rn = (95 * n + 99) / 100 THEN v END)
        FROM ranked GROUP BY k"""
    txn.execute(backend.sql(sql), args)
    return {k: (p50, p95) for k, p50, p95 in txn.fetchall()}


def usage_series_rows(
    txn: Transaction, backend: Backend, since: float, bucket: float
) -> list[dict[str, Any]]:
    """Requests and tokens per bucket (aligned to multiples of it) and route."""
    floor = "CAST({} / ? AS INTEGER)" if backend is SQLITE else "CAST(FLOOR({} / ?) AS BIGINT)"
    (raw_where, raw_args), minutes, _ = _parts(txn, since)
    sql = f"SELECT {floor.format('at')} AS b, route, {_RAW_SUMS} FROM usage{raw_where}"
    sql += " GROUP BY b, route"
    args: tuple = (bucket, *raw_args)
    if minutes is not None:
        sql += (
            f" UNION ALL SELECT {floor.format('minute')} AS b, route, {_MINUTE_SUMS}"
            f" FROM usage_minutes{minutes[0]} GROUP BY b, route"
        )
        args += (bucket, *minutes[1])
    txn.execute(backend.sql(sql), args)
    points: dict[tuple[int, str], list[int]] = {}
    for b, route, requests, _errors, prompt, cached, completion in txn.fetchall():
        sums = points.setdefault((int(b), route), [0, 0, 0, 0])
        for i, value in enumerate((requests, prompt, cached, completion)):
            sums[i] += int(value or 0)
    return [
        {
            "at": b * float(bucket),
            "route": route,
            "requests": requests,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "completion_tokens": completion,
        }
        for (b, route), (requests, prompt, cached, completion) in sorted(points.items())
    ]


def top_moves_rows(
    txn: Transaction, backend: Backend, since: float, limit: int
) -> list[dict[str, Any]]:
    """The conversations moved from one host to another most often since `since` (a lease
    event with both hosts and a model: not a birth, a drop or a pin), most first."""
    sql = """
        SELECT route, fp, model, COUNT(*) AS n, MAX(at) AS last
        FROM lease_events
        WHERE at >= ? AND from_host <> '' AND to_host <> '' AND model <> ''
        GROUP BY route, fp, model ORDER BY n DESC, last DESC, route, fp, model LIMIT ?"""
    txn.execute(backend.sql(sql), (since, limit))
    return [
        {"route": route, "fp": fp, "model": model, "moves": int(n), "last_moved": last}
        for route, fp, model, n, last in txn.fetchall()
    ]
