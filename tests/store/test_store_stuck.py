"""A store that is stuck, not gone, never stalls the proxy: a SQLite file another process has
locked, a PostgreSQL table locked for long, a database connection that goes silent. crossbar
goes on from memory within `store_timeout`, says so in /api/status, refuses operator changes
with 503, and catches up once the store answers again."""

import subprocess
import sys

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import DeferredList, ensureDeferred
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from tests.support.admin_harness import conversation, write_config
from tests.support.db_gate import DatabaseGate
from tests.support.harness import start_fakes, wait
from tests.support.pg import need_postgres, pg_schema
from tests.support.routes import CONVO

# Holds SQLite's write lock on the file named by argv[1] until its stdin closes: as a backup
# tool or another process with a long transaction would.
LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()
db.execute("COMMIT")
"""


class Locker:
    """Another process holding SQLite's write lock on `db` until `release`."""

    def __init__(self, db: str) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-c", LOCKER, db], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self._process.stdout.readline() == b"locked\n"

    def release(self) -> None:
        self._process.stdin.close()
        self._process.wait(30)


async def models_latency(running) -> float:
    """Seconds one `GET /r/convo/v1/models` (answered by crossbar itself) took."""
    started = reactor.seconds()
    response = await wait(running.http().get(f"{running.proxy_url}/r/convo/v1/models"))
    await response.content()
    assert response.code == 200
    return reactor.seconds() - started


async def latencies_while(running, seconds: float) -> list[float]:
    """`models_latency` back to back (10 ms apart) for `seconds`."""
    taken, end = [], reactor.seconds() + seconds
    while reactor.seconds() < end:
        taken.append(await models_latency(running))
        await deferLater(reactor, 0.01, lambda: None)
    return taken


async def status(running) -> dict:
    return await running.get("/api/status")


@pytest_twisted.ensureDeferred
async def test_a_locked_sqlite_file_stalls_no_request(tmp_path, serve):
    fakes = await start_fakes("titan", "atlas")
    db = str(tmp_path / "crossbar.db")
    # Heartbeats every half second keep the store's thread waiting on the lock nearly all
    # the time: whatever the reactor thread then had to finish of the store would wait too.
    server = {"db": db, "store_timeout": "2s", "health_interval": "500ms"}
    path = write_config(tmp_path / "c.toml", fakes, CONVO, server=server)
    running = await serve(path, fakes)
    await running.chat("convo", conversation("before"))
    locker = Locker(db)
    try:
        # A new conversation's lease write waits for the lock, then the store is degraded and
        # the conversation is served from memory; meanwhile nothing else may wait for it.
        new = ensureDeferred(running.chat("convo", conversation("while locked")))
        more = [ensureDeferred(running.chat("convo", conversation(f"more {i}"))) for i in range(3)]
        taken = await latencies_while(running, 6.0)
        host, _ = await wait(new)
        await wait(DeferredList(more))
        assert max(taken) < 1.0, f"a request waited {max(taken):.1f}s for the locked store"
        state = await status(running)
        assert state["status"] == "degraded" and state["store"]["unsaved_leases"] >= 1
        code, answer, _ = await running.call("PUT", "/api/routes/convo/pin", {"host": "atlas"})
        assert code == 503, answer
    finally:
        locker.release()
    # The lock gone, the store catches up by itself and the kept lease is written.
    for _ in range(200):
        if (await status(running))["status"] == "ok":
            break
        await deferLater(reactor, 0.05, lambda: None)
    state = await status(running)
    assert state["status"] == "ok" and state["store"]["unsaved_leases"] == 0
    again, _ = await running.chat("convo", conversation("while locked"))
    assert again == host  # the conversation kept its host through it all


async def one_instance_on_postgres(tmp_path, serve, url: str):
    fakes = await start_fakes("titan", "atlas")
    server = {"db": url, "store_timeout": "2s"}
    return await serve(write_config(tmp_path / "c.toml", fakes, CONVO, server=server), fakes)


async def stuck_and_quick(running) -> None:
    """With the store stuck: a new conversation is answered from memory within the
    store's deadline, /api/status says degraded, and a pin is refused with 503 as quickly."""
    started = reactor.seconds()
    await running.chat("convo", conversation("while stuck"))
    assert reactor.seconds() - started < 2 + 1 + 2  # store_timeout, the journal's slack, noise
    state = await status(running)
    assert state["status"] == "degraded", state
    started = reactor.seconds()
    code, answer, _ = await running.call("PUT", "/api/routes/convo/pin", {"host": "atlas"})
    assert code == 503, answer
    assert reactor.seconds() - started < 2  # refused at once: the store is known degraded
    assert max(await latencies_while(running, 1.0)) < 1.0


async def recovers(running) -> None:
    for _ in range(400):
        if (await status(running))["status"] == "ok":
            return
        await deferLater(reactor, 0.05, lambda: None)
    raise AssertionError("the store never recovered")


@pytest_twisted.ensureDeferred
async def test_a_postgres_table_locked_for_long_degrades_in_seconds_not_minutes(tmp_path, serve):
    need_postgres()
    with pg_schema() as url:
        running = await one_instance_on_postgres(tmp_path, serve, url)
        await running.chat("convo", conversation("before"))
        import psycopg

        # Another session holds the leases table in the strongest lock, and keeps it.
        holder = await deferToThread(psycopg.connect, url, autocommit=False)
        try:
            await deferToThread(holder.execute, "LOCK TABLE leases IN ACCESS EXCLUSIVE MODE")
            await stuck_and_quick(running)
        finally:
            await deferToThread(holder.rollback)
            await deferToThread(holder.close)
        await recovers(running)
        assert len(await running.parts.store.list_leases()) == 2  # the kept one written


@pytest_twisted.ensureDeferred
async def test_a_silent_postgres_connection_degrades_in_seconds_not_minutes(tmp_path, serve):
    need_postgres()
    with pg_schema() as url:
        gate = DatabaseGate(url)
        gate.open()
        running = await one_instance_on_postgres(tmp_path, serve, gate.url)
        await running.chat("convo", conversation("before"))
        gate.silence()  # packets go nowhere; no reset ever comes
        try:
            await stuck_and_quick(running)
        finally:
            gate.speak()
        await recovers(running)
        assert len(await running.parts.store.list_leases()) == 2
        await gate.shut()
