"""Settled report rows never change an answer: after any sequence of usage written as a running
crossbar writes it (each row at its own finishing time, the clock only going forward), roll-ups
and prunes, every report read with the rows kept equals the same report read without them."""

import sqlite3
from functools import partial

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crossbar.admin.views import top_usage
from crossbar.records import UsageRow
from crossbar.store.backends import POSTGRES, SQLITE, Backend
from crossbar.store.database import _USAGE_INSERT, _prune, _usage_values
from crossbar.store.reports import usage_series_rows, usage_totals_rows
from crossbar.store.rollups import ROLLUP_LAG, roll_up
from crossbar.store.settled import SettledRows
from crossbar.store.setup import init_connection, migrate
from tests.support.pg import need_postgres, pg_schema

DAY = 86400.0
NOW = 40 * DAY + 17.25  # not on a minute: bounds fall inside minutes and hours
STEPS = (0.5, 1.0, 29.0, 60.0, 61.0, 299.0, 3599.0, 3600.0, 3661.0, 7200.0, DAY / 2)
AGES = (0.0, 30.0, 59.5, 60.0, 90.0, 599.0, 3600.0, 3630.0, 5400.0, 7200.0, DAY, 3 * DAY)
BUCKETS = (30.0, 60.0, 120.0, 900.0, 3600.0, 7200.0)

record = st.tuples(
    st.just("record"),
    st.lists(
        st.tuples(
            st.floats(0.0, ROLLUP_LAG - 1.0),  # how long before now it finished
            st.sampled_from(("r0", "r1", "r2", "r3")),
            st.sampled_from(("a", "b")),
            st.integers(0, 50),  # prompt tokens (completion tokens: a fifth of them)
        ),
        min_size=1,
        max_size=4,
    ),
)
backlog = st.tuples(  # rows from before the first roll-up: any age then
    st.just("backlog"), st.lists(st.floats(0.0, 4 * DAY), min_size=1, max_size=6)
)
advance = st.tuples(st.just("advance"), st.sampled_from(STEPS))
rollup = st.tuples(st.just("roll_up"), st.sampled_from((0.0, 3600.0, DAY, 2 * DAY)))
prune = st.tuples(st.just("prune"), st.sampled_from((600.0, 5400.0, DAY, 2 * DAY, 3 * DAY)))
sweep = st.tuples(  # as Sweep.run: a prune, then a roll-up
    st.just("sweep"), st.sampled_from((3600.0, 7200.0, DAY)), st.sampled_from((0.0, 3600.0))
)
totals = st.tuples(
    st.just("totals"), st.sampled_from(("route", "host", "model")), st.sampled_from((None, *AGES))
)
series = st.tuples(
    st.just("series"),
    st.sampled_from(AGES[1:]),
    st.sampled_from(BUCKETS),
    st.sampled_from((None, 1, 2)),
)
operations = st.lists(
    st.one_of(record, backlog, advance, rollup, prune, sweep, totals, series),
    min_size=1,
    max_size=50,
)


class Usage:
    """A store's usage tables (SQLite in memory unless given a PostgreSQL connection), written
    and read as Store does, with the settled rows of its reports kept between reads."""

    def __init__(self, conn=None, backend: Backend = SQLITE) -> None:
        if conn is None:
            conn = sqlite3.connect(":memory:", isolation_level=None)
            init_connection(conn, memory=True)
        self.conn, self.backend, self.cur = conn, backend, conn.cursor()
        migrate(conn, backend)
        self.commit()
        self.now = NOW
        self.settled = SettledRows()

    def commit(self) -> None:
        if self.backend is not SQLITE:
            self.conn.commit()
        elif self.conn.in_transaction:
            self.cur.execute("COMMIT")

    def empty(self) -> None:
        """As new: no usage, no sums, nothing kept (another example on PostgreSQL)."""
        for table in ("usage", "usage_minutes", "usage_hours"):
            self.cur.execute(f"DELETE FROM {table}")
        self.cur.execute("UPDATE usage_rollup SET rolled_until = 0, hours_until = 0, raw_from = 0")
        self.commit()
        self.now, self.settled = NOW, SettledRows()

    def write(self, rows: list[UsageRow]) -> None:
        self.cur.execute(self.backend.begin_write or "SELECT 1")
        sql = self.backend.sql(_USAGE_INSERT)
        self.cur.executemany(sql, [_usage_values(row) for row in rows])
        self.commit()

    def rolled_until(self) -> float:
        self.cur.execute("SELECT rolled_until FROM usage_rollup")
        return float(self.cur.fetchone()[0])

    def roll_up(self, raw_age: float) -> None:
        roll_up(self.cur, self.backend, self.now, self.now - raw_age)
        self.commit()

    def prune(self, age: float) -> None:
        before = self.now - age
        _, usage, sums = _prune(self.cur, self.backend, 0.0, before, 0.0)
        self.commit()
        if usage or sums:  # as Store.prune does
            self.settled.clear()

    def both(self, report, *args):
        """The report read with the settled rows kept (twice: the second from memory) and
        without them."""
        kept = report(self.cur, self.backend, *args, settled=self.settled)
        again = report(self.cur, self.backend, *args, settled=self.settled)
        fresh = report(self.cur, self.backend, *args)
        self.commit()
        return kept, again, fresh


def usage(at: float, route: str = "r0", host: str = "a", prompt: int = 10) -> UsageRow:
    return UsageRow(at, route, "f", "m", host, "/v1/chat/completions", 200 if prompt % 7 else 503,
                    False, prompt_tokens=prompt, cached_tokens=prompt // 2,
                    completion_tokens=prompt // 5, ttfb_ms=float(prompt))  # fmt: skip


# What the dashboard reads on every refresh: each read after every step of a story, so rows
# kept before a write are read again after it.
DASHBOARD = (("totals", "route", None), ("totals", "model", DAY), ("series", DAY, 3600.0, 2))


def run(ops, dashboard: bool = True, u: Usage | None = None) -> None:
    u = u or Usage()
    for step in ops:
        for op in (step, *DASHBOARD) if dashboard else (step,):
            do(u, op)


def do(u: Usage, op) -> None:
    """One step of a story: a write, a sweep, the clock moving, or a report checked."""
    kind = op[0]
    if kind == "record":
        u.write([usage(u.now - ago, r, h, p) for ago, r, h, p in op[1]])
    elif kind == "backlog" and u.rolled_until() == 0:
        u.write([usage(u.now - ago) for ago in op[1]])
    elif kind == "advance":
        u.now += op[1]
    elif kind == "roll_up":
        u.roll_up(op[1])
    elif kind == "prune":
        u.prune(op[1])
    elif kind == "sweep":
        u.prune(op[1])
        u.roll_up(op[2])
    elif kind == "totals":
        since = None if op[2] is None else u.now - op[2]
        kept, again, fresh = u.both(usage_totals_rows, op[1], since)
        assert kept == fresh and again == fresh, (op, u.now)
        for sort, limit in (("requests", 2), ("cache_hit_ratio", 1), (op[1], None)):
            # Picked in the store's thread, percentiles read for the picked: as picked after.
            pick = partial(top_usage, sort=sort, limit=limit)
            picked = usage_totals_rows(u.cur, u.backend, op[1], since, pick=pick)
            assert picked == top_usage(fresh, sort, limit), (op, sort)
    elif kind == "series":
        _, age, bucket, top = op
        kept, again, fresh = u.both(usage_series_rows, u.now - age, bucket, top)
        assert kept == fresh and again == fresh, (op, u.now)
        if top is not None:
            every = usage_series_rows(u.cur, u.backend, u.now - age, bucket)
            assert fresh == top_series(every, top), op
    u.commit()


def top_series(series: list[dict], top: int) -> list[dict]:
    """The chart's top routes as the admin API picked them from every route's points before
    the store did (admin_views.top_series at ac6740d): the reference."""
    sums = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens")
    tokens: dict[str, int] = {}
    for p in series:
        tokens[p["route"]] = tokens.get(p["route"], 0) + p["prompt_tokens"] + p["completion_tokens"]
    keep = set(sorted(tokens, key=lambda r: (-tokens[r], r))[:top])
    out = [p for p in series if p["route"] in keep]
    other: dict[float, dict] = {}
    for p in series:
        if p["route"] not in keep:
            o = other.setdefault(p["at"], {**p, "route": "(other)"} | dict.fromkeys(sums, 0))
            for name in sums:
                o[name] += p[name]
    return out + sorted(other.values(), key=lambda p: p["at"])


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(operations)
def test_reports_with_settled_rows_kept_answer_as_reports_without_them(ops):
    run(ops)


def test_reports_with_settled_rows_kept_answer_as_without_them_on_postgresql():
    import psycopg

    need_postgres()
    with pg_schema() as url, psycopg.connect(url) as conn:
        u = Usage(conn, POSTGRES)

        @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(operations)
        def check(ops):
            u.empty()
            run(ops, u=u)

        check()


def test_a_dashboard_day_of_refreshes_roll_ups_and_prunes_answers_as_without_kept_rows():
    # A fixed story beside the random ones: rows every half minute, a sweep every 10 minutes
    # (a prune of what is older than three hours, then a roll-up), the chart and the tables
    # read every 3 minutes over the last hour and the last day, for half a day.
    ops: list = [("backlog", [i * 600.0 for i in range(20)])]
    for step in range(1440):
        ops.append(("record", [(0.0, f"r{step % 4}", "ab"[step % 2], step % 50)]))
        ops.append(("advance", 30.0))
        if step % 20 == 0:
            ops.append(("sweep", 3 * 3600.0, 3600.0))
        if step % 6 == 0:
            ops += [("totals", "route", 3600.0), ("series", DAY, 3600.0, 2)]
            ops += [("series", 3600.0, 60.0, 1), ("totals", "host", None)]
    run(ops, dashboard=False)
