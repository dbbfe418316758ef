"""The store's usage reports, written once for SQLite and PostgreSQL alike (run in the store's
thread).

A report over a window the raw rows still cover (`since` at or after `raw_from`) reads the raw
rows alone. An older window reads the raw rows from `rolled_until` on, the per-minute sums
before it, and, for the whole hours before `hours_until`, the per-hour sums (a month is 720
hours, not 43,200 minutes). The TTFB percentiles, which cannot be summed, come from the raw
rows the window still has (the last server.usage_raw_retention). Every range read is on an
index: usage (at), and the sums' primary keys, which start with their minute or hour.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attrs import frozen
from twisted.enterprise.adbapi import Transaction

from crossbar.store.backends import SQLITE, Backend
from crossbar.store.settled import SettledRows

_NAMES = ("requests", "errors", "prompt_tokens", "cached_tokens", "completion_tokens")
_RAW_SUMS = """COUNT(*) AS requests,
               SUM(CASE WHEN status >= 400 OR error <> '' THEN 1 ELSE 0 END) AS errors,
               SUM(prompt_tokens) AS prompt_tokens, SUM(cached_tokens) AS cached_tokens,
               SUM(completion_tokens) AS completion_tokens"""
_SUMS = """SUM(requests) AS requests, SUM(errors) AS errors, SUM(prompt_tokens) AS prompt_tokens,
           SUM(cached_tokens) AS cached_tokens, SUM(completion_tokens) AS completion_tokens"""
_INF = float("inf")
PERCENTILE_SAMPLE = 10_000  # the latest raw rows of a window the TTFB percentiles read


@frozen
class Bounds:
    """How far the sums reach: raw rows before `rolled_until` are in usage_minutes, minutes
    before `hours_until` in usage_hours; raw rows are kept from `raw_from` on."""

    rolled_until: float
    raw_from: float
    hours_until: float


@frozen
class Part:
    """One range of one table a report reads: `column` in [lo, hi)."""

    table: str
    column: str
    lo: float
    hi: float
    sums: str


def rollup_bounds(txn: Transaction) -> Bounds:
    """The sums' reach, as usage_rollup records it."""
    txn.execute("SELECT rolled_until, raw_from, hours_until FROM usage_rollup")
    return Bounds(*(float(v) for v in txn.fetchone()))


def _parts(
    txn: Transaction, since: float | None, minutes: bool = True, hours: bool = True
) -> tuple[list[Part], float]:
    """The ranges of raw rows and sums a window from `since` reads (each row counted once),
    and where the raw rows still kept begin (for percentiles). Sums answer wherever they
    exist: raw rows are read only after `rolled_until` (the last few minutes) and for the
    window's first, partial minute. `minutes`/`hours`: whole minutes/hours may come from the
    sums (not for a series whose buckets are not whole minutes/hours, while raw rows remain)."""
    b = rollup_bounds(txn)
    start = since if since is not None else -_INF
    kept_from = max(start, b.raw_from)
    raw_covers = since is not None and since >= b.raw_from
    if b.rolled_until <= start or (raw_covers and not minutes):
        return [Part("usage", "at", start, _INF, _RAW_SUMS)], kept_from
    parts = [Part("usage", "at", b.rolled_until, _INF, _RAW_SUMS)]
    first = -(-start // 60) * 60 if since is not None else -_INF  # the first whole minute
    if start < first:  # a partial minute: its raw rows if kept, else the whole minute's sum
        if raw_covers:
            parts.append(Part("usage", "at", start, min(first, b.rolled_until), _RAW_SUMS))
        else:
            first -= 60
    hour = -(-first // 3600) * 3600 if since is not None else -_INF  # the first whole hour
    if hours and hour < b.hours_until:
        parts.append(Part("usage_minutes", "minute", first, hour, _SUMS))
        parts.append(Part("usage_hours", "hour", hour, b.hours_until, _SUMS))
        parts.append(Part("usage_minutes", "minute", b.hours_until, b.rolled_until, _SUMS))
    else:
        parts.append(Part("usage_minutes", "minute", first, b.rolled_until, _SUMS))
    return [p for p in parts if p.lo < p.hi], kept_from


def _check_floor(txn: Transaction, settled: SettledRows | None) -> None:
    """Tell `settled` the oldest minute and hour summed (two lookups on the sums' primary
    keys), so a prune by any instance empties it before it answers."""
    if settled is not None:
        txn.execute(
            "SELECT (SELECT MIN(minute) FROM usage_minutes), (SELECT MIN(hour) FROM usage_hours)"
        )
        settled.floor(tuple(txn.fetchone()))


def _select(part: Part, what: str, group: str) -> tuple[str, tuple]:
    """The SELECT of one part (`what` with {col}: its time column), and its bounds."""
    where, bounds = [], []
    if part.lo != -_INF:
        where.append(f"{part.column} >= ?")
        bounds.append(part.lo)
    if part.hi != _INF:
        where.append(f"{part.column} < ?")
        bounds.append(part.hi)
    clause = " WHERE " + " AND ".join(where) if where else ""
    head = what.format(col=part.column)
    return f"SELECT {head}, {part.sums} FROM {part.table}{clause} GROUP BY {group}", tuple(bounds)


def _fetch(
    txn: Transaction,
    backend: Backend,
    settled: SettledRows | None,
    parts: list[Part],
    what: str,
    group: str,
    head: tuple = (),
) -> list[tuple[Any, ...]]:
    """The rows of every part (`head`: the arguments of `what`, before each part's bounds).
    A part that ends before `rolled_until` has settled: its rows may come from `settled`."""
    rows: list[tuple[Any, ...]] = []
    for part in parts:
        sql, bounds = _select(part, what, group)
        sql, args = backend.sql(sql), (*head, *bounds)
        if settled is not None and part.hi != _INF:
            rows += settled.fetch(txn, sql, args)
        else:
            txn.execute(sql, args)
            rows += txn.fetchall()
    return rows


Pick = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


def usage_totals_rows(
    txn: Transaction,
    backend: Backend,
    by: str,
    since: float | None,
    percentiles: bool = True,
    pick: Pick | None = None,
    settled: SettledRows | None = None,
) -> list[dict[str, Any]]:
    """Totals per `by` (a column name the caller checked: never client text), sorted by it;
    `pick` chooses some of them (a top ten) before the percentiles are read, for those only."""
    _check_floor(txn, settled)
    parts, kept_from = _parts(txn, since)
    totals: dict[str, list[int]] = {}
    for key, *values in _fetch(txn, backend, settled, parts, by, by):
        sums = totals.setdefault(key, [0] * len(_NAMES))
        for i, value in enumerate(values):
            sums[i] += int(value or 0)
    rows = [{by: key, **dict(zip(_NAMES, totals[key], strict=True))} for key in sorted(totals)]
    if pick is not None:
        rows = pick(rows)
    keys = [row[by] for row in rows] if len(rows) < len(totals) else None
    pct = _percentiles(txn, backend, by, kept_from, keys) if percentiles and rows else {}
    for row in rows:
        row["ttfb_p50_ms"], row["ttfb_p95_ms"] = pct.get(row[by], (None, None))
    return rows


def _percentiles(
    txn: Transaction, backend: Backend, by: str, since: float, keys: list[str] | None
) -> dict[str, tuple[float | None, float | None]]:
    """Nearest-rank p50 and p95 of the time to first byte per `by` (of `keys` only, unless
    None), over the window's latest PERCENTILE_SAMPLE raw rows (all of them in a quieter
    window): read newest first on the `at` index, so a busy day costs as much as a quiet hour."""
    where, args = ("", ()) if since == -_INF else (" AND at >= ?", (since,))
    sample = (
        f"SELECT {by}, ttfb_ms FROM usage WHERE ttfb_ms IS NOT NULL{where} ORDER BY at DESC LIMIT ?"
    )
    sql, args = sample, (*args, PERCENTILE_SAMPLE)
    if keys is not None:  # the same sample; only the rows of `keys` come back to Python
        sql = f"SELECT * FROM ({sample}) sample WHERE {by} IN ({', '.join('?' * len(keys))})"
        args = (*args, *keys)
    txn.execute(backend.sql(sql), args)
    groups: dict[str, list[float]] = {}
    for key, value in txn.fetchall():
        groups.setdefault(key, []).append(float(value))
    out = {}
    for key, values in groups.items():
        values.sort()
        n = len(values)
        # nearest rank: the ceil(p * n)-th smallest, in integer arithmetic
        out[key] = (values[(n + 1) // 2 - 1], values[(95 * n + 99) // 100 - 1])
    return out


OTHER = "(other)"  # the route of a series' points summing every route not in its top


def usage_series_rows(
    txn: Transaction,
    backend: Backend,
    since: float,
    bucket: float,
    top: int | None = None,
    settled: SettledRows | None = None,
) -> list[dict[str, Any]]:
    """Requests and tokens per bucket (aligned to multiples of it) and route. With `top`: the
    `top` routes with the most tokens, and every other route summed per bucket as route
    "(other)" (last), so a chart of a thousand routes is a few lines and a few hundred rows."""
    floor = (
        "CAST({col} / ? AS INTEGER)" if backend is SQLITE else "CAST(FLOOR({col} / ?) AS BIGINT)"
    )
    _check_floor(txn, settled)
    parts, _ = _parts(txn, since, minutes=bucket % 60 == 0, hours=bucket % 3600 == 0)
    head, head_args = floor + " AS b, route", (bucket,)
    if top is not None:
        keep = _top_routes(_fetch(txn, backend, settled, parts, "route", "route"), top)
        marks = ", ".join("?" * len(keep)) or "NULL"
        head = floor + f" AS b, CASE WHEN route IN ({marks}) THEN route ELSE ? END AS route"
        head_args = (bucket, *keep, OTHER)
    points: dict[tuple[int, str], list[int]] = {}
    for b, route, requests, _errors, prompt, cached, completion in _fetch(
        txn, backend, settled, parts, head, "1, 2", head_args
    ):
        sums = points.setdefault((int(b), route), [0, 0, 0, 0])
        for i, value in enumerate((requests, prompt, cached, completion)):
            sums[i] += int(value or 0)
    order = sorted(points, key=lambda p: (p[1] == OTHER, p) if top is not None else p)
    return [
        {
            "at": b * float(bucket),
            "route": route,
            "requests": requests,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "completion_tokens": completion,
        }
        for b, route in order
        for requests, prompt, cached, completion in (points[(b, route)],)
    ]


def _top_routes(rows: list[tuple[Any, ...]], top: int) -> list[str]:
    """The `top` routes with the most prompt and completion tokens in `rows` (route first,
    then the sums; ties by name)."""
    tokens: dict[str, int] = {}
    for route, _requests, _errors, prompt, _cached, completion in rows:
        tokens[route] = tokens.get(route, 0) + int(prompt or 0) + int(completion or 0)
    return sorted(tokens, key=lambda r: (-tokens[r], r))[:top]


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
