"""Opening crossbar's store: connection setup, the numbered schema migrations (the same steps on
SQLite and PostgreSQL), what to tell an operator when it cannot be opened, and closing it
(docs/reference.md, "Store"). The queries are database.py's.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from twisted.enterprise.adbapi import ConnectionPool
from twisted.internet.interfaces import IReactorCore
from twisted.internet.threads import deferToThreadPool

from crossbar.config import redact
from crossbar.store.backends import (
    SQLITE,
    STORE_TIMEOUT,
    Backend,
    backend_for,
    postgres_defaults,
)

_MIGRATION_LOCK = 0x63726F73  # "cros": one instance migrates a PostgreSQL store at a time


class StoreError(Exception):
    """The store cannot be opened, read or written; the message names the database (with any
    password hidden)."""


def check(db: str) -> str | None:
    """Open and migrate the store once, synchronously, before the reactor runs (twistd's
    start-up): why it cannot be used, as Store.open would say it, or None."""
    if db == ":memory:":
        return None
    backend = backend_for(db)
    try:
        conn = connect(backend, db)
    except Exception as e:
        return diagnose(db, e)
    try:
        if backend is SQLITE:
            init_connection(conn, memory=False)
        migrate(conn, backend)
        conn.commit()
    except Exception as e:
        return diagnose(db, e)
    finally:
        conn.close()
    return None


def connect(backend: Backend, db: str) -> Any:
    """A plain DB-API connection (autocommit for SQLite) for start-up and offline tools."""
    if backend is SQLITE:
        return sqlite3.connect(db, isolation_level=None)
    import psycopg

    return psycopg.connect(db, **postgres_defaults(db))


def init_connection(conn: sqlite3.Connection, memory: bool, timeout: float = STORE_TIMEOUT) -> None:
    """Set up each new SQLite connection (adbapi's cp_openfun); a write waits at most
    `timeout` seconds for another process's lock."""
    try:
        conn.execute(f"PRAGMA busy_timeout = {max(1, round(timeout * 1000))}")
        if not memory:
            wal(conn, timeout)
        # In WAL mode NORMAL loses at most the last transactions on power loss, never
        # consistency; FULL would fsync on every lease change.
        conn.execute("PRAGMA synchronous = NORMAL")
    except BaseException:
        conn.close()  # adbapi keeps no reference to a connection whose setup failed
        raise


def wal(
    conn: sqlite3.Connection,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], object] = time.sleep,
) -> None:
    """Put the file in WAL mode. Switching takes the file for itself, and SQLite answers at
    once, without its busy wait, while another process holds it (two instances starting on a
    new file together): the old mode, or SQLITE_BUSY while the other one is in a write
    (migrating). Asked again every 50 ms until `timeout`. Runs in the store's thread or before
    the reactor starts, never on the reactor."""
    deadline = clock() + timeout
    while True:
        try:
            (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
        except sqlite3.OperationalError as e:
            if not _busy(e):
                raise
            mode = "locked by another connection"
        if mode.lower() == "wal":
            return
        if clock() > deadline:
            raise StoreError(f"SQLite refused WAL mode for {timeout:g} s (journal mode: {mode})")
        pause(0.05)


def _busy(error: sqlite3.OperationalError) -> bool:
    # SQLITE_BUSY and its extended codes (SQLITE_BUSY_RECOVERY, _SNAPSHOT, _TIMEOUT).
    return error.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY


def migrations() -> list[tuple[int, str]]:
    """The schema steps shipped as package data, as (version, sql with placeholders)."""
    steps = []
    for entry in resources.files("crossbar.store").joinpath("schema").iterdir():
        if entry.name.endswith(".sql"):
            steps.append((int(entry.name.split("-", 1)[0]), entry.read_text("utf-8")))
    steps.sort()
    if [n for n, _ in steps] != list(range(1, len(steps) + 1)):
        raise StoreError(f"schema files are not numbered 1..n: {[n for n, _ in steps]}")
    return steps


def migrate(conn: Any, backend: Backend = SQLITE) -> int:
    """Bring the schema to the latest version in one transaction (the caller commits); a
    second instance starting at the same time waits for the first, then finds it done."""
    cur = conn.cursor()
    if backend is SQLITE:
        cur.execute("BEGIN IMMEDIATE")
    else:
        # A migration may take longer than the store's statement timeout, and so may the
        # wait for another instance migrating: not bounded, in this transaction only.
        cur.execute("SET LOCAL statement_timeout = 0")
        cur.execute("SET LOCAL lock_timeout = 0")
        cur.execute(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")
    cur.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    cur.execute("SELECT version FROM schema_version")
    row = cur.fetchone()
    if row is None:
        cur.execute("INSERT INTO schema_version (version) VALUES (0)")
    version = row[0] if row else 0
    steps = migrations()
    latest = steps[-1][0]
    if version > latest:
        raise StoreError(
            f"its schema version is {version}, newer than this crossbar's {latest}; "
            "run a newer crossbar or another store"
        )
    for number, sql in steps:
        if number > version:
            for statement in _statements(backend.schema(sql)):
                cur.execute(statement)
    # This UPDATE writes even when there was nothing to migrate: a database that can be read
    # but not written (a read-only file) fails here, at start, not at the first lease.
    cur.execute(backend.sql("UPDATE schema_version SET version = ?"), (latest,))
    return latest


def _statements(sql: str) -> list[str]:
    # SQLite's executescript() would commit the open transaction first; split so that all of
    # a migration (and the version bump) is one transaction. Comments go first: a semicolon
    # in one must not end a statement.
    lines = [line.split("--", 1)[0] for line in sql.splitlines()]
    statements, pending = [], ""
    for line in lines:
        pending += line + "\n"
        if sqlite3.complete_statement(pending):
            if pending.strip():
                statements.append(pending.strip())
            pending = ""
    return statements


def diagnose(db: str, error: BaseException) -> str:
    """Why `db` could not be opened, in words an operator can act on (no password)."""
    if isinstance(error, StoreError):
        return str(error)
    text = str(error)
    if backend_for(db) is not SQLITE:
        password = urlsplit(db).password
        if password:
            text = text.replace(password, "***")
        return f"PostgreSQL says: {text.strip() or error.__class__.__name__}"
    if db != ":memory:" and not db.startswith("file:"):
        file = Path(db).absolute()
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


def describe(db: str) -> str:
    """The store as logs and errors name it."""
    return redact(db)


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
