"""Usage reports at scale: 10 million usage rows, rolled up as the sweep does, and the answers of
/api/usage and /api/usage/series over the dashboard's windows.

    .venv/bin/python bench/fleet/usage_scale.py [--rows 10000000] [--days 30] [--routes 100]
                                          [--db PATH_OR_POSTGRES_URL] [--reuse] [--json]

Opens a fresh store (an SQLite file in a temporary directory unless --db names one; a
PostgreSQL URL must name an empty database or schema), writes `--rows` usage rows spread evenly
over the last `--days` days across `--routes` routes and two hosts, by SQL inside the database
(SQLite: a recursive CTE; PostgreSQL: generate_series), runs the sweep's roll-up until caught up
(an hour of rows per step, as successive sweeps would; per-minute and per-hour sums, raw rows
kept for the default 48 h), then times the store's usage_totals (route, with
TTFB percentiles) and usage_series (the dashboard's buckets, top 8) for 1 h, 24 h, 7 d and
30 d: the first answer (nothing kept) and a refresh (settled rows kept), each the best of
three. `--reuse` times the reports on an existing `--db` (filled by an earlier run). Prints
the database size before and after, and the bytes per raw row.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from twisted.internet import defer, task

from crossbar.store.backends import SQLITE, backend_for
from crossbar.store.database import Store

DAY = 86400.0
RAW_RETENTION = 2 * DAY
WINDOWS = {"1h": 3600.0, "24h": DAY, "7d": 7 * DAY, "30d": 30 * DAY}

SQLITE_FILL = """
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?)
INSERT INTO usage (at, route, fp, model, host, path, status, stream, prompt_tokens,
                   cached_tokens, completion_tokens, ttfb_ms, duration_ms)
SELECT ? - i * ?, 'team-' || (i % ?), printf('%x', i % 50000), 'qwen-coder',
       CASE WHEN i % 2 THEN 'titan' ELSE 'atlas' END, '/v1/chat/completions',
       CASE WHEN i % 97 = 0 THEN 503 ELSE 200 END, 1, 1000 + i % 500, i % 900, 50 + i % 40,
       20.0 + i % 300, 400.0 + i % 2000
FROM n"""

PG_FILL = """
INSERT INTO usage (at, route, fp, model, host, path, status, stream, prompt_tokens,
                   cached_tokens, completion_tokens, ttfb_ms, duration_ms)
SELECT %s - i * %s, 'team-' || (i %% %s), to_hex(i %% 50000), 'qwen-coder',
       CASE WHEN i %% 2 = 1 THEN 'titan' ELSE 'atlas' END, '/v1/chat/completions',
       CASE WHEN i %% 97 = 0 THEN 503 ELSE 200 END, 1, 1000 + i %% 500, i %% 900, 50 + i %% 40,
       20.0 + i %% 300, 400.0 + i %% 2000
FROM generate_series(0, %s - 1) AS i"""


def _fill(txn: Any, sqlite: bool, rows: int, now: float, step: float, routes: int) -> None:
    if sqlite:
        txn.execute("BEGIN IMMEDIATE")
        txn.execute(SQLITE_FILL, (rows, now, step, routes))
    else:
        txn.execute(PG_FILL, (now, step, routes, rows))


def _size(txn: Any, sqlite: bool) -> int:
    if sqlite:
        txn.execute("PRAGMA page_count")
        (pages,) = txn.fetchone()
        txn.execute("PRAGMA page_size")
        (size,) = txn.fetchone()
        return int(pages * size)
    txn.execute("SELECT pg_total_relation_size('usage') + pg_total_relation_size('usage_minutes')")
    return int(txn.fetchone()[0])


def _count(txn: Any, table: str) -> int:
    txn.execute(f"SELECT COUNT(*) FROM {table}")
    return int(txn.fetchone()[0])


async def best_of(n: int, store: Store, fn: Any, *args: Any) -> tuple[float, float]:
    """In milliseconds: the fastest of `n` first answers (nothing kept from an earlier report:
    a window asked for the first time) and of `n` refreshes (the same report again, the settled
    sums' rows kept, as the dashboard's next refresh)."""
    first, again = [], []
    for _ in range(n):
        store.settled.clear()
        for times in (first, again):
            started = time.perf_counter()
            await fn(*args)
            times.append((time.perf_counter() - started) * 1000)
    return min(first), min(again)


def _newest(txn: Any) -> float:
    txn.execute("SELECT MAX(at) FROM usage")
    return float(txn.fetchone()[0])


async def fill_and_roll_up(store: Store, args: argparse.Namespace, now: float) -> dict[str, Any]:
    """Write the rows, roll them up as the sweeps would (an hour of rows each): the sizes."""
    sqlite = store.backend is SQLITE
    pool = store._pool  # the bench reaches into the store's one connection, on its thread
    step = args.days * DAY / args.rows
    started = time.perf_counter()
    await pool.runInteraction(_fill, sqlite, args.rows, now, step, args.routes)
    fill_s = time.perf_counter() - started
    before = await pool.runInteraction(_size, sqlite)
    started = time.perf_counter()
    written = deleted = steps = 0
    longest = 0.0
    while True:
        one = time.perf_counter()
        done = await store.roll_up(now, now - RAW_RETENTION)
        longest = max(longest, time.perf_counter() - one)
        written, deleted, steps = written + done.minutes, deleted + done.deleted, steps + 1
        if done.caught_up:
            break
    rollup_s = time.perf_counter() - started
    if sqlite:
        await pool.runWithConnection(lambda conn: conn.execute("VACUUM"))
    return {
        "fill_s": fill_s,
        "rollup_s": rollup_s,
        "rollup_steps": steps,
        "rollup_longest_step_s": longest,
        "minute_rows_written": written,
        "raw_rows_deleted": deleted,
        "bytes_before": before,
        "bytes_after": await pool.runInteraction(_size, sqlite),
        "bytes_per_raw_row": before / args.rows,
    }


async def run(reactor: Any, args: argparse.Namespace, db: str) -> dict[str, Any]:
    """Fill, roll up, time the reports."""
    store = await Store.open(db, reactor)
    sqlite = store.backend is SQLITE
    pool = store._pool  # the bench reaches into the store's one connection, on its thread
    try:
        now = time.time()
        report: dict[str, Any] = {}
        if not args.reuse:
            report = await fill_and_roll_up(store, args, now)
        else:
            report["bytes_after"] = await pool.runInteraction(_size, sqlite)
            now = await pool.runInteraction(_newest)
        report["raw_rows_kept"] = await pool.runInteraction(_count, "usage")
        report["minute_rows"] = await pool.runInteraction(_count, "usage_minutes")
        timings: dict[str, dict[str, float]] = {}
        for name, seconds in WINDOWS.items():
            rough = max(10.0, round(seconds / 60))  # the dashboard's bucket for the window
            bucket = max(1, round(rough / 3600)) * 3600.0 if rough >= 1200 else rough
            usage = await best_of(3, store, store.usage_totals, "route", now - seconds)
            series = await best_of(3, store, store.usage_series, now - seconds, bucket, 8)
            timings[name] = {
                "usage_ms": usage[0],
                "series_ms": series[0],
                "usage_refresh_ms": usage[1],
                "series_refresh_ms": series[1],
            }
        return {
            "backend": store.backend.name,
            "rows": args.rows,
            "days": args.days,
            "routes": args.routes,
            **report,
            "timings": timings,
        }
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run in a reactor, print the report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--days", type=float, default=30.0)
    p.add_argument("--routes", type=int, default=100)
    p.add_argument("--db", help="an SQLite path or a PostgreSQL URL (default: a temporary file)")
    p.add_argument("--reuse", action="store_true", help="time the reports on --db as it is")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="crossbar-usage-scale-"))
    db = args.db or str(work / "usage.db")
    if backend_for(db) is SQLITE and os.path.exists(db) != bool(args.reuse):
        p.error(f"{db} exists: name a new file" if not args.reuse else f"no {db} to reuse")
    box: dict[str, Any] = {}

    async def go(reactor: Any) -> None:
        box["report"] = await run(reactor, args, db)

    try:
        task.react(lambda r: defer.ensureDeferred(go(r)))
    except SystemExit as e:
        if e.code:
            return int(e.code)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    r = box["report"]
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"{r['backend']}: {r['rows']:,} rows over {r['days']:g} days, {r['routes']} routes")
    if "fill_s" in r:
        print(f"filled in {r['fill_s']:.1f} s; {r['bytes_before'] / 1e6:.0f} MB "
              f"({r['bytes_per_raw_row']:.0f} bytes per raw row)")  # fmt: skip
        print(f"roll-up: {r['rollup_s']:.1f} s in {r['rollup_steps']} steps (longest "
              f"{r['rollup_longest_step_s']:.2f} s)")  # fmt: skip
    print(f"{r['minute_rows']:,} minute rows, {r['raw_rows_kept']:,} raw rows kept; "
          f"{r['bytes_after'] / 1e6:.0f} MB")  # fmt: skip
    print("        first answer (usage, series)   refresh (usage, series)")
    for name, t in r["timings"].items():
        print(f"  {name:>4}: {t['usage_ms']:7.1f} ms {t['series_ms']:7.1f} ms        "
              f"{t['usage_refresh_ms']:7.1f} ms {t['series_refresh_ms']:7.1f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
