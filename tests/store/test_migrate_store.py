"""`crossbar migrate-store FROM TO`: a crossbar that ran on its SQLite file starts on the new
store (PostgreSQL, or another file) with every conversation where it was, its pins and drains,
its history and its usage; refusals leave TO untouched and say why."""

import contextlib
import io
import sqlite3

import pytest
import pytest_twisted
from twisted.internet.threads import deferToThread

from crossbar.cli.main import main
from crossbar.store.setup import check
from tests.support.admin_harness import conversation
from tests.support.fleet import start_fleet
from tests.support.harness import MODEL, start_fakes, wait

ROUTES = {
    "convo": {"hosts": ["titan", "atlas"], "default_model": MODEL},
    "other": {"hosts": ["titan", "atlas"], "default_model": MODEL},
}


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


async def migrate(source: str, target: str) -> tuple[int, str, str]:
    return await wait(deferToThread(_run, ["migrate-store", source, target]), 60)


def _with_password(url: str) -> str:
    """PostgreSQL's trust auth ignores a password: one that must never be printed."""
    return url.replace("postgres@", "postgres:hunter2@", 1) if "://" in url else url


async def _history(tmp_path, fakes):
    """A crossbar on an SQLite file: conversations, a pin, a drain; then stopped."""
    fleet = await start_fleet(tmp_path / "old", str(tmp_path / "old.db"), fakes, ROUTES, n=1)
    (old,) = fleet.instances
    homes = {}
    for name in ("a", "b", "c", "d"):
        homes[name], _ = await old.chat("convo", conversation(name))
    await old.call("PUT", "/api/routes/other/pin", {"host": "atlas"})
    await old.call("POST", "/api/hosts/titan/drain")
    usage = (await old.get("/api/usage?by=route"))["usage"]
    events = (await old.get("/api/events?limit=100"))["events"]
    await old.stop()
    return homes, usage, events


@pytest_twisted.ensureDeferred
async def test_a_crossbar_moved_to_a_new_store_starts_where_it_was(tmp_path, shared_url, fleets):
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    fakes = await start_fakes("titan", "atlas")
    homes, usage, events = await _history(tmp_path, fakes)
    target = _with_password(shared_url)

    code, out, err = await migrate(str(tmp_path / "old.db"), target)

    assert (code, err) == (0, "")
    assert "hunter2" not in out
    assert "  5 leases and pins" in out and "  1 host states" in out
    assert f"  {len(events)} lease events" in out and "  4 usage rows" in out
    fleet = await fleets(tmp_path / "new", target, fakes, ROUTES, n=1)
    (new,) = fleet.instances
    for name, home in homes.items():  # titan is draining: its conversations stay on it
        host, _ = await new.chat("convo", conversation(name))
        assert host == home, name
    routes = {r["name"]: r["pinned"] for r in (await new.get("/api/routes"))["routes"]}
    assert routes["other"] == "atlas"
    assert [h["draining"] for h in (await new.get("/api/hosts"))["hosts"]] == [True, False]
    moved = (await new.get("/api/events?limit=100"))["events"]
    assert moved == events  # nothing moved on the new store: the same history
    totals = (await new.get("/api/usage?by=route"))["usage"]
    assert [u["requests"] for u in totals] == [u["requests"] + 4 for u in usage]


@pytest_twisted.ensureDeferred
async def test_a_store_with_a_running_crossbar_is_not_copied(tmp_path):
    fakes = await start_fakes("titan", "atlas")
    fleet = await start_fleet(tmp_path, str(tmp_path / "live.db"), fakes, ROUTES, n=1)
    try:
        await fleet.instances[0].chat("convo", conversation("a"))
        code, out, err = await migrate(str(tmp_path / "live.db"), str(tmp_path / "new.db"))
    finally:
        await fleet.stop()
    assert (code, out) == (1, "")
    assert "wrote a heartbeat" in err and "stop every crossbar using it first" in err
    assert not (tmp_path / "new.db").exists() or _count(tmp_path / "new.db", "leases") == 0


@pytest_twisted.ensureDeferred
async def test_a_target_that_holds_data_is_refused_and_left_as_it_was(tmp_path):
    (tmp_path / "old").mkdir()
    fakes = await start_fakes("titan", "atlas")
    await _history(tmp_path, fakes)
    for fake in fakes.values():
        await fake.stop()
    assert (await migrate(str(tmp_path / "old.db"), str(tmp_path / "new.db")))[0] == 0
    leases = _count(tmp_path / "new.db", "leases")

    code, out, err = await migrate(str(tmp_path / "old.db"), str(tmp_path / "new.db"))

    assert (code, out) == (1, "")
    assert f"already holds {leases} leases and pins" in err and "empty store only" in err
    assert _count(tmp_path / "new.db", "leases") == leases
    assert _count(tmp_path / "new.db", "lease_events") == _count(
        tmp_path / "old.db", "lease_events"
    )


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("missing.db", "missing.db: no such file"),
        (":memory:", '":memory:" holds nothing'),
        ("plain.db", "is not a crossbar store"),
        ("new.db", "FROM and TO are the same store"),
    ],
)
def test_bad_sources_are_one_line_and_exit_1(tmp_path, monkeypatch, source, says):
    monkeypatch.chdir(tmp_path)
    sqlite3.connect("plain.db").execute("CREATE TABLE t (x)").connection.close()
    code, out, err = _run(["migrate-store", source, "new.db"])
    assert (code, out) == (1, "")
    assert err.startswith("crossbar migrate-store: ") and says in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "missing.db").exists()


def test_an_unreachable_target_names_it_without_its_password(tmp_path):
    assert check(str(tmp_path / "old.db")) is None  # an empty crossbar store
    code, out, err = _run(
        ["migrate-store", str(tmp_path / "old.db"), "postgresql://u:hunter2@127.0.0.1:1/db"]
    )
    assert (code, out) == (1, "")
    assert "cannot open postgresql://u:***@127.0.0.1:1/db: PostgreSQL says:" in err
    assert "hunter2" not in err and len(err.strip().splitlines()) == 1


def _count(path, table: str) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
