"""The store, on SQLite and on PostgreSQL alike: schema migrations, leases and events, usage
totals, pruning, clear errors; and what SQLite alone does (files, pragmas)."""

import os
import shutil
import sqlite3
import subprocess
import sys

import pytest
import pytest_twisted
from twisted.internet.task import Clock

from crossbar.leases.table import Key, Lease, State
from crossbar.records import LeaseEvent, UsageRow
from crossbar.store.database import StoreError
from crossbar.store.setup import migrations, wal
from tests.support.lease_fakes import open_store


def lease(route="r", fp="f", model="m", host="a", at=1.0, state=State.ACTIVE) -> Lease:
    return Lease(Key(route, fp, model), host, state, at, at)


def event(at, route="r", reason="new", to="a") -> LeaseEvent:
    return LeaseEvent(at, route, "f", "m", "", to, reason)


def usage(at, route="r", host="a", model="m", status=200, error="", ttfb=None, **kw) -> UsageRow:
    return UsageRow(at, route, "f", model, host, "/v1/chat/completions", status, True,
                    ttfb_ms=ttfb, error=error, **kw)  # fmt: skip


# -- schema ---------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_new_file_gets_every_migration_and_wal(tmp_path):
    path = str(tmp_path / "x.db")
    s = await open_store(path)
    await s.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(len(migrations()),)]
    tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"leases", "lease_events", "usage", "host_state", "schema_version"} <= tables
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def _migrating(path):
    """A first instance's connection in the middle of its migration: the file in rollback
    mode, its write lock held."""
    first = sqlite3.connect(path, isolation_level=None)
    first.execute("CREATE TABLE t (x)")
    first.execute("BEGIN IMMEDIATE")
    return first


def test_an_instance_starting_beside_one_migrating_asks_again_until_the_file_is_free(tmp_path):
    path = str(tmp_path / "x.db")
    first = _migrating(path)
    second = sqlite3.connect(path, isolation_level=None)
    pauses = []

    def pause(seconds):  # the first instance's migration ends while the second waits
        pauses.append(seconds)
        if len(pauses) == 2:
            first.execute("COMMIT")

    wal(second, timeout=5.0, clock=Clock().seconds, pause=pause)
    assert pauses == [0.05, 0.05]
    assert second.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    first.close()
    second.close()


def test_a_file_held_past_the_store_timeout_is_refused_saying_so(tmp_path):
    path = str(tmp_path / "x.db")
    first = _migrating(path)
    second = sqlite3.connect(path, isolation_level=None)
    clock = Clock()
    with pytest.raises(StoreError, match=r"refused WAL mode for 2 s .*locked by another"):
        wal(second, timeout=2.0, clock=clock.seconds, pause=clock.advance)
    assert 2.0 <= clock.seconds() <= 2.05  # it gave up at the timeout, not before
    first.close()
    second.close()


@pytest_twisted.ensureDeferred
async def test_sqlite_connection_settings(sqlite_store):
    assert await sqlite_store._pool.runQuery("PRAGMA busy_timeout") == [(5000,)]
    assert await sqlite_store._pool.runQuery("PRAGMA synchronous") == [(1,)]  # NORMAL


def test_migrations_are_numbered_from_one():
    assert [n for n, _ in migrations()] == list(range(1, len(migrations()) + 1))


@pytest_twisted.ensureDeferred
async def test_reopening_a_file_keeps_everything_and_migrates_nothing_twice(tmp_path):
    path = str(tmp_path / "x.db")
    s = await open_store(path)
    await s.apply(save=[lease()], events=[event(5.0)])
    await s.record_usage(usage(6.0))
    await s.set_draining("b", True)
    await s.close()
    s = await open_store(path)
    try:
        assert await s.list_leases() == [lease()]
        assert await s.list_events() == [event(5.0)]
        assert (await s.usage_totals("host"))[0]["requests"] == 1
        assert await s.list_draining() == {"b"}
    finally:
        await s.close()


@pytest_twisted.ensureDeferred
async def test_a_database_from_a_newer_crossbar_is_refused(tmp_path):
    path = str(tmp_path / "x.db")
    await (await open_store(path)).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE schema_version SET version = 999")
    with pytest.raises(StoreError, match="newer"):
        await open_store(path)


# -- leases and events ----------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_leases_are_saved_replaced_and_deleted(store):
    await store.apply(save=[lease()])
    await store.apply(save=[lease(host="b")])  # same key: replaced
    assert await store.list_leases() == [lease(host="b")]
    await store.apply(delete=[Key("r", "f", "m")])
    assert await store.list_leases() == []


@pytest_twisted.ensureDeferred
async def test_pins_round_trip_with_their_state(store):
    await store.apply(save=[lease(fp="", model="", state=State.PINNED)])
    assert (await store.list_leases())[0].state is State.PINNED


@pytest_twisted.ensureDeferred
async def test_apply_is_all_or_nothing(store):
    await store.apply(save=[lease(fp="old")])
    broken = LeaseEvent(None, "r", "f", "m", "", "a", "new")  # at NOT NULL
    with pytest.raises(StoreError, match="saving leases failed"):
        await store.apply(save=[lease()], delete=[Key("r", "old", "m")], events=[broken])
    assert await store.list_leases() == [lease(fp="old")]
    assert await store.list_events() == []


@pytest_twisted.ensureDeferred
async def test_list_events_newest_first_filtered_by_route_and_since(store):
    for at, route in [(1.0, "r"), (2.0, "s"), (3.0, "r"), (3.0, "r"), (4.0, "s")]:
        await store.apply(events=[event(at, route, to=f"h{at}")])
    assert [e.at for e in await store.list_events()] == [4.0, 3.0, 3.0, 2.0, 1.0]
    assert [e.at for e in await store.list_events(route="r")] == [3.0, 3.0, 1.0]
    assert [e.at for e in await store.list_events(since=3.0)] == [4.0, 3.0, 3.0]
    assert [e.at for e in await store.list_events(route="s", since=3.0)] == [4.0]
    assert [e.at for e in await store.list_events(limit=2)] == [4.0, 3.0]
    assert await store.list_events(limit=0) == []


# -- usage ----------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_usage_totals_count_tokens_errors_and_ttfb_percentiles(store):
    for i in range(1, 101):  # ttfb 1..100 ms on route r, host a
        await store.record_usage(
            usage(float(i), ttfb=float(i), prompt_tokens=10, cached_tokens=4, completion_tokens=2)
        )
    await store.record_usage(usage(200.0, status=503))  # an error without a ttfb
    await store.record_usage(usage(201.0, route="s", host="b", error="upstream reset", ttfb=7.0))
    by_route = await store.usage_totals("route")
    assert by_route == [
        {
            "route": "r",
            "requests": 101,
            "errors": 1,
            "prompt_tokens": 1000,
            "cached_tokens": 400,
            "completion_tokens": 200,
            "ttfb_p50_ms": 50.0,
            "ttfb_p95_ms": 95.0,
        },
        {
            "route": "s",
            "requests": 1,
            "errors": 1,
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "completion_tokens": 0,
            "ttfb_p50_ms": 7.0,
            "ttfb_p95_ms": 7.0,
        },
    ]
    assert [(t["host"], t["requests"]) for t in await store.usage_totals("host")] == [
        ("a", 101),
        ("b", 1),
    ]
    assert [(t["model"], t["requests"]) for t in await store.usage_totals("model")] == [("m", 102)]


@pytest_twisted.ensureDeferred
async def test_usage_totals_since_and_groups_without_ttfb(store):
    await store.record_usage(usage(1.0, ttfb=1.0))
    await store.record_usage(usage(2.0, status=404))
    [only] = await store.usage_totals("route", since=2.0)
    assert (only["requests"], only["errors"], only["ttfb_p50_ms"]) == (1, 1, None)
    with pytest.raises(ValueError, match="by must be one of"):
        await store.usage_totals("fp; DROP TABLE usage")


@pytest_twisted.ensureDeferred
async def test_usage_series_sums_per_bucket_and_route(store):
    for at, route, prompt in [(55.0, "r", 1), (60.0, "r", 2), (61.0, "s", 4), (119.0, "r", 8)]:
        await store.record_usage(usage(at, route=route, prompt_tokens=prompt, cached_tokens=1))
    series = await store.usage_series(since=56.0, bucket=60.0)
    assert [(p["at"], p["route"], p["requests"], p["prompt_tokens"]) for p in series] == [
        (60.0, "r", 2, 10),
        (60.0, "s", 1, 4),
    ]
    assert series[0]["cached_tokens"] == 2 and series[0]["completion_tokens"] == 0


@pytest_twisted.ensureDeferred
async def test_a_top_series_keeps_the_busiest_routes_and_sums_the_rest_as_other(store):
    tokens = {"a": 50, "b": 40, "c": 5, "d": 7}  # per request; two buckets of each route
    for route, prompt in tokens.items():
        for at in (60.0, 130.0):
            await store.record_usage(usage(at, route=route, prompt_tokens=prompt))
    series = await store.usage_series(since=60.0, bucket=60.0, top=2)
    assert [(p["at"], p["route"], p["requests"], p["prompt_tokens"]) for p in series] == [
        (60.0, "a", 1, 50),
        (60.0, "b", 1, 40),
        (120.0, "a", 1, 50),
        (120.0, "b", 1, 40),
        (60.0, "(other)", 2, 12),
        (120.0, "(other)", 2, 12),
    ]
    everything = await store.usage_series(since=60.0, bucket=60.0, top=10)
    assert {p["route"] for p in everything} == set(tokens)  # no "(other)" when all fit


@pytest_twisted.ensureDeferred
async def test_a_pick_of_usage_totals_reads_percentiles_for_the_picked_groups_alone(store):
    for route, ttfb in [("r", 10.0), ("r", 30.0), ("s", 5.0), ("t", 7.0)]:
        await store.record_usage(usage(1.0, route=route, ttfb=ttfb))

    def busiest(rows):
        return sorted(rows, key=lambda row: -row["requests"])[:1]

    [top] = await store.usage_totals("route", pick=busiest)
    assert (top["route"], top["requests"], top["ttfb_p50_ms"], top["ttfb_p95_ms"]) == (
        "r",
        2,
        10.0,
        30.0,
    )


# -- housekeeping ---------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_prune_deletes_only_older_rows(store):
    for at in (1.0, 2.0, 3.0):
        await store.apply(events=[event(at)])
        await store.record_usage(usage(at))
    assert await store.prune(events_before=3.0, usage_before=2.0) == (2, 1)
    assert [e.at for e in await store.list_events()] == [3.0]
    assert (await store.usage_totals("route"))[0]["requests"] == 2


@pytest_twisted.ensureDeferred
async def test_draining_round_trip(store):
    assert await store.list_draining() == set()
    await store.set_draining("a", True)
    await store.set_draining("b", True)
    await store.set_draining("a", False)
    assert await store.list_draining() == {"b"}


@pytest_twisted.ensureDeferred
async def test_a_closed_store_refuses_work():
    s = await open_store()
    await s.close()
    await s.close()  # twice is fine
    with pytest.raises(StoreError, match="after close"):
        await s.list_leases()


# -- stores that cannot be opened -----------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_missing_directory_is_named(tmp_path):
    path = tmp_path / "nowhere" / "x.db"
    with pytest.raises(StoreError, match=f"store {path}: directory {path.parent} does not exist"):
        await open_store(str(path))


@pytest_twisted.ensureDeferred
async def test_a_file_that_is_not_a_database_is_named(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("shopping list\n" * 100)
    with pytest.raises(StoreError, match=f"store {path}: the file is not a SQLite database"):
        await open_store(str(path))


@pytest_twisted.ensureDeferred
async def test_a_directory_is_not_a_database(tmp_path):
    with pytest.raises(StoreError, match="it is a directory"):
        await open_store(str(tmp_path))


# File modes do not bind root, so as root these run the open in a child without the
# capabilities that override them.
OPEN_SCRIPT = """
import sys
from twisted.internet import defer, task
from crossbar.store.database import Store, StoreError

async def main(reactor):
    try:
        store = await Store.open(sys.argv[1], reactor)
    except StoreError as e:
        print(e)
    else:
        await store.close()
        print("opened")

task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
"""


def open_unprivileged(path) -> str:
    command = [sys.executable, "-c", OPEN_SCRIPT, str(path)]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("root without setpriv: file modes cannot be tested")
        command = [setpriv, "--bounding-set=-dac_override,-dac_read_search", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest_twisted.ensureDeferred
async def test_a_read_only_file_fails_at_open_not_at_the_first_write(tmp_path):
    path = tmp_path / "x.db"
    await (await open_store(str(path))).close()
    assert open_unprivileged(path) == "opened"
    path.chmod(0o444)
    assert open_unprivileged(path) == f"cannot open the store {path}: the file is read-only"


@pytest_twisted.ensureDeferred
async def test_a_read_only_directory_is_named(tmp_path):
    existing = tmp_path / "x.db"
    await (await open_store(str(existing))).close()
    tmp_path.chmod(0o555)
    try:
        for path in (existing, tmp_path / "new.db"):
            assert open_unprivileged(path).startswith(
                f"cannot open the store {path}: directory {tmp_path} is not writable"
            )
    finally:
        tmp_path.chmod(0o755)


@pytest_twisted.ensureDeferred
async def test_durable_writes_are_committed_with_synchronous_full_and_the_rest_are_not(
    sqlite_store,
):
    store = sqlite_store
    statements = []
    await store._pool.runWithConnection(lambda conn: conn.set_trace_callback(statements.append))
    await store.apply(save=[lease(fp="pin")], durable=True)
    await store.set_draining("a", True)
    await store.apply(save=[lease(fp="plain")])
    await store._pool.runWithConnection(lambda conn: conn.set_trace_callback(None))
    marks = [s for s in statements if s.startswith(("PRAGMA synchronous", "COMMIT"))]
    durable = ["PRAGMA synchronous = FULL", "COMMIT", "PRAGMA synchronous = NORMAL"]
    assert marks == [*durable, *durable, "COMMIT"]
