"""Opening crossbar's SQLite store: connection setup, the numbered schema migrations, what to
tell an operator when it cannot be opened, and closing it (SPEC §9). The queries are store.py's.
"""

from __future__ import annotations

import os
import sqlite3
from importlib import resources
from pathlib import Path
from typing import Any

from twisted.enterprise.adbapi import ConnectionPool
from twisted.internet.interfaces import IReactorCore
from twisted.internet.threads import deferToThreadPool

from crossbar.instance_lock import InstanceBusy, InstanceLock

BUSY_TIMEOUT_MS = 5000  # another process (a backup, the sqlite3 shell) may hold a lock briefly


class StoreError(Exception):
    """The store cannot be opened, read or written; the message names the database."""


def check(path: str) -> str | None:
    """Open and migrate the database once, synchronously, before the reactor runs (twistd's
    start-up): why it cannot be used, as Store.open would say it, or None."""
    if path == ":memory:":
        return None
    try:
        lock = InstanceLock.take(path)
    except InstanceBusy as e:
        return str(e)
    try:
        return _check(path)
    finally:
        if lock is not None:
            lock.release()


def _check(path: str) -> str | None:
    try:
        conn = sqlite3.connect(path, isolation_level=None)
    except sqlite3.Error as e:
        return diagnose(path, e)
    try:
        init_connection(conn, memory=False)
        migrate(conn)
        conn.execute("COMMIT")
    except Exception as e:
        return diagnose(path, e)
    finally:
        conn.close()
    return None


def init_connection(conn: sqlite3.Connection, memory: bool) -> None:
    """Set up each new connection (adbapi's cp_openfun)."""
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if not memory:
            (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            if mode.lower() != "wal":
                raise StoreError(f"SQLite refused WAL mode (journal mode is {mode})")
        # In WAL mode NORMAL loses at most the last transactions on power loss, never
        # consistency; FULL would fsync on every lease change.
        conn.execute("PRAGMA synchronous = NORMAL")
    except BaseException:
        conn.close()  # adbapi keeps no reference to a connection whose setup failed
        raise


def migrations() -> list[tuple[int, str]]:
    """The schema steps shipped as package data, as (version, sql), in order."""
    steps = []
    for entry in resources.files("crossbar").joinpath("schema").iterdir():
        if entry.name.endswith(".sql"):
            steps.append((int(entry.name.split("-", 1)[0]), entry.read_text("utf-8")))
    steps.sort()
    if [n for n, _ in steps] != list(range(1, len(steps) + 1)):
        raise StoreError(f"schema files are not numbered 1..n: {[n for n, _ in steps]}")
    return steps


def migrate(conn: Any) -> int:
    cur = conn.cursor()
    cur.execute("BEGIN IMMEDIATE")
    cur.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = cur.execute("SELECT version FROM schema_version").fetchone()
    if row is None:
        cur.execute("INSERT INTO schema_version (version) VALUES (0)")
    version = row[0] if row else 0
    steps = migrations()
    latest = steps[-1][0]
    if version > latest:
        raise StoreError(
            f"its schema version is {version}, newer than this crossbar's {latest}; "
            "run a newer crossbar or another db file"
        )
    for number, sql in steps:
        if number > version:
            for statement in _statements(sql):
                cur.execute(statement)
    # This UPDATE writes even when there was nothing to migrate: a database that can be read
    # but not written (a read-only file) fails here, at start, not at the first lease.
    cur.execute("UPDATE schema_version SET version = ?", (latest,))
    return latest


def _statements(sql: str) -> list[str]:
    # executescript() would commit the open transaction first; split so that all of a
    # migration (and the version bump) is one transaction.
    statements, pending = [], ""
    for line in sql.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    return statements


def diagnose(path: str, error: Exception) -> str:
    """Why `path` could not be opened, in words an operator can act on."""
    if isinstance(error, StoreError):
        return str(error)
    text = str(error)
    if path != ":memory:" and not path.startswith("file:"):
        file = Path(path).absolute()
        if not file.parent.is_dir():
            return f"directory {file.parent} does not exist"
        if file.is_dir():
            return "it is a directory"
        if "not a database" in text:
            return "the file is not a SQLite database"
        if file.exists() and not os.access(file, os.W_OK):
            return "the file is read-only"
        if not os.access(file.parent, os.W_OK):
            return (
                f"directory {file.parent} is not writable "
                "(SQLite creates its -wal and -shm files beside the database)"
            )
    return f"SQLite says: {text}"


async def shut(pool: ConnectionPool, reactor: IReactorCore) -> None:
    """Close the connection in the thread that uses it, then stop the pool."""

    def disconnect() -> None:
        conn = pool.connections.pop(pool.threadID(), None)
        if conn is not None:
            conn.close()  # a WAL checkpoint may run here: off the reactor thread

    try:
        await deferToThreadPool(reactor, pool.threadpool, disconnect)
    finally:
        pool.close()
