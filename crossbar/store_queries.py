"""The store's usage reports, written once for SQLite and PostgreSQL alike (run in the store's
thread)."""

from __future__ import annotations

from typing import Any

from twisted.enterprise.adbapi import Transaction

from crossbar.backends import SQLITE, Backend

_CLIENTS = " WHERE lease <> 'prewarm'"  # client requests only
_NAMES = ("requests", "errors", "prompt_tokens", "cached_tokens", "completion_tokens")


def usage_totals_rows(
    txn: Transaction, backend: Backend, by: str, since: float | None
) -> list[dict[str, Any]]:
    """Totals per `by` (a column name the caller checked: never client text)."""
    # Prewarm rows (lease "prewarm") are crossbar's own hand-off work, counted apart.
    where, args = (_CLIENTS, ()) if since is None else (_CLIENTS + " AND at >= ?", (since,))
    sql = f"""
        WITH picked AS (SELECT * FROM usage{where}),
        totals AS (
            SELECT {by} AS k, COUNT(*) AS requests,
                   SUM(CASE WHEN status >= 400 OR error <> '' THEN 1 ELSE 0 END) AS errors,
                   SUM(prompt_tokens) AS prompt, SUM(cached_tokens) AS cached,
                   SUM(completion_tokens) AS completion
            FROM picked GROUP BY {by}),
        ranked AS (
            SELECT {by} AS k, ttfb_ms AS v,
                   ROW_NUMBER() OVER (PARTITION BY {by} ORDER BY ttfb_ms) AS rn,
                   COUNT(*) OVER (PARTITION BY {by}) AS n
            FROM picked WHERE ttfb_ms IS NOT NULL),
        pct AS (
            -- nearest rank: the ceil(p * n)-th smallest, in integer arithmetic
            SELECT k, MIN(CASE WHEN rn = (n + 1) / 2 THEN v END) AS p50,
                      MIN(CASE WHEN rn = (95 * n + 99) / 100 THEN v END) AS p95
            FROM ranked GROUP BY k)
        SELECT t.k, requests, errors, prompt, cached, completion, p50, p95
        FROM totals t LEFT JOIN pct ON pct.k = t.k ORDER BY t.k"""
    txn.execute(backend.sql(sql), args)
    return [
        {
            by: row[0],
            **{name: _int(value) for name, value in zip(_NAMES, row[1:6], strict=True)},
            "ttfb_p50_ms": row[6],
            "ttfb_p95_ms": row[7],
        }
        for row in txn.fetchall()
    ]


def usage_series_rows(
    txn: Transaction, backend: Backend, since: float, bucket: float
) -> list[dict[str, Any]]:
    """Requests and tokens per bucket (aligned to multiples of it) and route."""
    floor = "CAST(at / ? AS INTEGER)" if backend is SQLITE else "CAST(FLOOR(at / ?) AS BIGINT)"
    sql = f"""
        SELECT {floor} AS b, route, COUNT(*), SUM(prompt_tokens),
               SUM(cached_tokens), SUM(completion_tokens)
        FROM usage{_CLIENTS} AND at >= ? GROUP BY b, route ORDER BY b, route"""
    txn.execute(backend.sql(sql), (bucket, since))
    return [
        {
            "at": b * float(bucket),
            "route": route,
            "requests": _int(requests),
            "prompt_tokens": _int(prompt),
            "cached_tokens": _int(cached),
            "completion_tokens": _int(completion),
        }
        for b, route, requests, prompt, cached, completion in txn.fetchall()
    ]


def _int(value: Any) -> int | None:
    # PostgreSQL sums integers as numeric (a Decimal in Python): JSON wants a number.
    return None if value is None else int(value)
