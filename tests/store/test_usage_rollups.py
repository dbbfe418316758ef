"""Usage at scale, on SQLite and PostgreSQL alike: raw rows are summed per minute and
(route, host, model) before they go, and the reports read the sums for older windows, so they
answer the same before and after; every range they read is on an index."""

import sqlite3

import pytest_twisted

from crossbar.records import UsageRow
from crossbar.store.backends import SQLITE
from crossbar.store.reports import usage_series_rows, usage_totals_rows
from crossbar.store.rollups import ROLLUP_LAG, roll_up
from crossbar.store.setup import init_connection, migrate

DAY = 86400.0
NOW = 40 * DAY  # a clock far from zero, as real ones are


def usage(at, route="r", host="a", status=200, ttfb=None, prompt=10, cached=4) -> UsageRow:
    return UsageRow(at, route, "f", "m", host, "/v1/chat/completions", status, False,
                    prompt_tokens=prompt, cached_tokens=cached, completion_tokens=2,
                    ttfb_ms=ttfb)  # fmt: skip


def without_percentiles(rows):
    return [{k: v for k, v in r.items() if not k.startswith("ttfb")} for r in rows]


async def fill(store) -> None:
    """Rows over the last four days: two routes, two hosts, an error every seventh."""
    rows = []
    for i in range(400):
        at = NOW - 4 * DAY + i * 860.0 + 0.5
        rows.append(usage(at, route="r" if i % 3 else "s", host="ab"[i % 2],
                          status=503 if i % 7 == 0 else 200, ttfb=float(i % 50)))  # fmt: skip
    await store.record_usage_rows(rows)


@pytest_twisted.ensureDeferred
async def test_reports_answer_the_same_after_the_raw_rows_are_summed_and_pruned(store):
    await fill(store)
    windows = [None, NOW - 3.5 * DAY, NOW - DAY, NOW - 3600]
    totals = {w: await store.usage_totals("route", w) for w in windows}
    by_host = await store.usage_totals("host", NOW - 3.5 * DAY)
    series = {w: await store.usage_series(w, 3600.0) for w in windows[1:]}

    # Four days of backlog: an hour per roll-up (a short transaction each), the reports
    # right all along.
    steps, written, deleted = 0, 0, 0
    while True:
        done = await store.roll_up(NOW, raw_before=NOW - 2 * DAY)
        steps, written, deleted = steps + 1, written + done.minutes, deleted + done.deleted
        if steps == 50:
            assert without_percentiles(await store.usage_totals("route")) == (
                without_percentiles(totals[None])
            )
        if done.caught_up:
            break
    assert 4 * 24 - 1 <= steps <= 4 * 24 + 1
    assert written > 0 and 0 < deleted < 400  # the last two days stay raw

    for w in windows:
        after = await store.usage_totals("route", w)
        assert without_percentiles(after) == without_percentiles(totals[w]), w
    assert without_percentiles(await store.usage_totals("host", NOW - 3.5 * DAY)) == (
        without_percentiles(by_host)
    )
    for w, points in series.items():
        assert await store.usage_series(w, 3600.0) == points, w
    # Percentiles cannot be summed: they come from the raw rows still kept, and a window
    # inside the raw days is exact.
    assert await store.usage_totals("route", NOW - DAY) == totals[NOW - DAY]
    assert (await store.usage_totals("route"))[0]["ttfb_p50_ms"] is not None

    # A second sweep adds nothing twice; new rows after the summed minutes are counted raw.
    again = await store.roll_up(NOW, raw_before=NOW - 2 * DAY)
    assert (again.minutes, again.deleted, again.caught_up) == (0, 0, True)
    await store.record_usage(usage(NOW - 10.0, route="s"))
    s = {r["route"]: r for r in await store.usage_totals("route")}["s"]
    assert s["requests"] == totals[None][1]["requests"] + 1


async def roll_up_all(store, now: float, raw_before: float) -> int:
    """Roll up until caught up, as sweeps would; the raw rows deleted."""
    deleted = 0
    while True:
        done = await store.roll_up(now, raw_before)
        deleted += done.deleted
        if done.caught_up:
            return deleted


@pytest_twisted.ensureDeferred
async def test_raw_rows_are_never_deleted_before_they_are_summed(store):
    await store.record_usage_rows([usage(NOW - 100.0), usage(NOW - 3 * DAY)])
    # raw_before in the future: only minutes ROLLUP_LAG old are summed, and only they may go.
    assert await roll_up_all(store, NOW, raw_before=NOW + DAY) == 1
    assert (await store.usage_totals("route"))[0]["requests"] == 2
    assert (await store.usage_totals("route", NOW - 200.0))[0]["requests"] == 1


@pytest_twisted.ensureDeferred
async def test_prune_drops_old_sums_with_usage_retention(store):
    await store.record_usage_rows([usage(NOW - 20 * DAY), usage(NOW - 3 * DAY)])
    await roll_up_all(store, NOW, raw_before=NOW - 2 * DAY)
    assert (await store.usage_totals("route"))[0]["requests"] == 2
    await store.prune(events_before=0.0, usage_before=NOW - 10 * DAY)
    assert (await store.usage_totals("route"))[0]["requests"] == 1


@pytest_twisted.ensureDeferred
async def test_a_refresh_reads_settled_sums_once_and_the_newest_rows_every_time(store):
    await fill(store)
    await roll_up_all(store, NOW, raw_before=NOW - 2 * DAY)
    first = await store.usage_totals("route", NOW - 3.5 * DAY)
    chart = await store.usage_series(NOW - 3.5 * DAY, 3600.0, top=1)
    read = store.settled.misses
    assert read > 0
    # The dashboard's next refresh: the same windows; the settled parts come from memory.
    assert await store.usage_totals("route", NOW - 3.5 * DAY) == first
    assert await store.usage_series(NOW - 3.5 * DAY, 3600.0, top=1) == chart
    assert store.settled.misses == read and store.settled.hits >= read
    # A request that just finished counts at once: the newest rows are read every time.
    await store.record_usage(usage(NOW - 5.0, route="s"))
    s = {r["route"]: r for r in await store.usage_totals("route", NOW - 3.5 * DAY)}["s"]
    assert s["requests"] == {r["route"]: r for r in first}["s"]["requests"] + 1
    # A roll-up changes no settled range: what was read stays right and is kept.
    await store.roll_up(NOW + 600.0, raw_before=NOW - 2 * DAY)
    kept = await store.usage_totals("route", NOW - 3.5 * DAY)
    store.settled.clear()
    assert kept == await store.usage_totals("route", NOW - 3.5 * DAY)
    # A prune deletes settled rows: nothing read before it is kept.
    await store.prune(events_before=0.0, usage_before=NOW - 3 * DAY)
    assert store.settled.hits and not store.settled._rows
    after = {r["route"]: r for r in await store.usage_totals("route", NOW - 3.5 * DAY)}
    assert after["s"]["requests"] < s["requests"]


def test_every_report_and_sweep_statement_reads_its_range_on_an_index(tmp_path):
    conn = sqlite3.connect(str(tmp_path / "plan.db"), isolation_level=None)
    init_connection(conn, memory=False)
    migrate(conn)
    conn.execute("COMMIT")
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    cur = conn.cursor()
    roll_up(cur, SQLITE, NOW, NOW - 2 * DAY)
    conn.execute("COMMIT")
    cur.execute("UPDATE usage_rollup SET raw_from = ?", (NOW - 2 * DAY,))
    for by in ("route", "host", "model"):
        usage_totals_rows(cur, SQLITE, by, NOW - 7 * DAY)  # sums and raw rows
        usage_totals_rows(cur, SQLITE, by, NOW - 3600)  # raw rows alone
    usage_series_rows(cur, SQLITE, NOW - 7 * DAY, 3600.0)
    usage_series_rows(cur, SQLITE, NOW - 3600, 60.0)
    usage_series_rows(cur, SQLITE, NOW - 7 * DAY, 3600.0, top=8)  # the chart's top routes
    conn.set_trace_callback(None)
    reads = [s for s in statements if "usage" in s and not s.startswith(("UPDATE", "BEGIN"))]
    assert len(reads) >= 10 and any("FROM usage_hours" in s for s in reads)
    for sql in reads:
        plan = " | ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql))
        for table in ("usage", "usage_minutes", "usage_hours"):
            assert f"SCAN {table} " not in plan + " " and not plan.endswith(f"SCAN {table}"), (
                sql,
                plan,
            )
    assert ROLLUP_LAG >= 60


@pytest_twisted.ensureDeferred
async def test_the_sweep_sums_a_day_of_backlog_per_run_and_prunes_raw_rows_after_48h(store):
    from twisted.internet.task import Clock

    from crossbar.app.sweep import ROLLUP_STEPS, Sweep
    from crossbar.config.values import parse_config
    from tests.support.lease_fakes import make_table

    await fill(store)  # four days of rows
    before = without_percentiles(await store.usage_totals("route"))
    clock = Clock()
    clock.advance(NOW)
    config = parse_config({"hosts": {"a": {"url": "http://127.0.0.1:9", "models": ["m"]}}})
    sweep = Sweep(config, await make_table(store), store, clock)
    runs = 0
    while True:
        runs += 1
        await sweep.run()
        if (await store.roll_up(NOW, NOW - 2 * DAY)).caught_up:
            break
    assert runs == -(-4 * 24 // ROLLUP_STEPS)  # a day per sweep
    assert without_percentiles(await store.usage_totals("route")) == before
    [(raw,)] = await store._pool.runQuery("SELECT COUNT(*) FROM usage")
    assert raw == 199  # the rows of the last two days (i >= 201 of 400) stay raw


@pytest_twisted.ensureDeferred
async def test_the_most_moved_conversations_count_moves_only(store):
    from crossbar.records import LeaseEvent

    def event(fp, at, frm="titan", to="atlas", model="m", reason="unhealthy"):
        return LeaseEvent(at, "r", fp, model, frm, to, reason)

    await store.apply(events=[event("x", 10.0), event("x", 20.0), event("y", 30.0),
                              event("z", 40.0, frm=""),  # born, not moved
                              event("", 50.0, model=""),  # a pin row
                              event("x", 1.0)])  # fmt: skip
    moves = await store.top_moves(since=5.0, limit=10)
    assert [(m["fp"], m["moves"], m["last_moved"]) for m in moves] == [
        ("x", 2, 20.0),
        ("y", 1, 30.0),
    ]
    assert len(await store.top_moves(since=0.0, limit=1)) == 1
