"""crossbar's SQLite store (SPEC §9): leases and pins, lease events, usage rows, drained hosts.

One connection through `twisted.enterprise.adbapi` (one thread, so writes complete in the order
they were submitted and ":memory:" stays one database), WAL, `synchronous=NORMAL`. The schema is
package data: `schema/NNN-name.sql`, applied in order, the version kept in `schema_version`.
Functions run by `runInteraction` execute in the pool's thread and never touch the reactor.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from attrs import astuple, fields
from twisted.enterprise.adbapi import ConnectionPool, Transaction
from twisted.internet.interfaces import IReactorCore
from twisted.internet.threads import deferToThreadPool

from crossbar.instance_lock import InstanceBusy, InstanceLock
from crossbar.lease import Key, Lease, State
from crossbar.records import LeaseEvent, UsageRow
from crossbar.store_setup import (
    StoreError,
    check,
    diagnose,
    init_connection,
    migrate,
    migrations,
    shut,
)

__all__ = ["USAGE_GROUPS", "Store", "StoreError", "check", "migrations"]

T = TypeVar("T")

USAGE_GROUPS = ("route", "host", "model")
_LEASE_COLUMNS = "route, fp, model, host, state, created, last_used"
# The records' fields are the tables' columns, in order.
_EVENT_COLUMNS = ", ".join(a.name for a in fields(LeaseEvent))
_USAGE_COLUMNS = ", ".join(a.name for a in fields(UsageRow))


class Store:
    """The database. Open it with `await Store.open(path, reactor)`; every method is async."""

    def __init__(
        self,
        pool: ConnectionPool,
        path: str,
        reactor: IReactorCore,
        lock: InstanceLock | None = None,
    ) -> None:
        self._pool = pool
        self._reactor = reactor
        self.path = path
        self._lock = lock
        self._closed = False

    @classmethod
    async def open(cls, path: str, reactor: IReactorCore) -> Store:
        """Open (creating if needed) and migrate the database at `path` (":memory:" allowed).

        Raises StoreError saying why when it cannot be opened, read or written, or when
        another crossbar uses it (one instance per store file)."""
        try:
            lock = InstanceLock.take(path)
        except InstanceBusy as e:
            raise StoreError(str(e)) from None
        pool = ConnectionPool(
            "sqlite3",
            path,
            cp_min=1,
            cp_max=1,
            check_same_thread=False,
            isolation_level=None,  # autocommit; write interactions BEGIN explicitly
            cp_openfun=lambda conn: init_connection(conn, memory=path == ":memory:"),
            cp_reactor=reactor,
        )
        try:
            await pool.runWithConnection(migrate)
        except Exception as e:
            reason = await deferToThreadPool(reactor, pool.threadpool, diagnose, path, e)
            await shut(pool, reactor)
            if lock is not None:
                lock.release()
            raise StoreError(f"cannot open the store {path}: {reason}") from e
        return cls(pool, path, reactor, lock)

    async def close(self) -> None:
        """Close the connection (in its own thread) and stop the pool."""
        if not self._closed:
            self._closed = True
            try:
                await shut(self._pool, self._reactor)
            finally:
                if self._lock is not None:
                    self._lock.release()

    async def _run(self, what: str, fn: Callable[..., T], *args: Any, durable: bool = False) -> T:
        if self._closed:
            raise StoreError(f"store {self.path}: {what} after close")
        try:
            if durable:
                return await self._pool.runWithConnection(_durably, fn, *args)
            return await self._pool.runInteraction(fn, *args)
        except sqlite3.Error as e:
            raise StoreError(f"store {self.path}: {what} failed: {e}") from e

    # -- leases ------------------------------------------------------------------------------

    async def apply(
        self,
        save: Iterable[Lease] = (),
        delete: Iterable[Key] = (),
        events: Iterable[LeaseEvent] = (),
        durable: bool = False,
    ) -> None:
        """Delete, save (upsert) and record events in one transaction: all or nothing.

        `durable`: synced to disk before it returns (`synchronous = FULL` for this commit),
        for changes an operator is told are made; the rest may lose their last transactions
        on a power loss (never on a crash of the process), as WAL with NORMAL does."""
        rows = [_lease_row(lease) for lease in save]
        keys = [(k.route, k.fp, k.model) for k in delete]
        evs = [_event_row(e) for e in events]
        if rows or keys or evs:
            await self._run("saving leases", _apply, rows, keys, evs, durable=durable)

    async def ping(self) -> None:
        """A write that changes nothing: raises StoreError while the store cannot be written."""
        await self._run("checking the store", _touch_version)

    async def list_leases(self) -> list[Lease]:
        """Every lease and pin row."""
        rows = await self._run("listing leases", _query, f"SELECT {_LEASE_COLUMNS} FROM leases")
        states = {s.value: s for s in State}  # a dict lookup; State(value) is slower
        return [
            Lease(Key(route, fp, model), host, states[state], created, last_used)
            for route, fp, model, host, state, created, last_used in rows
        ]

    async def list_events(
        self, route: str | None = None, since: float | None = None, limit: int = 100
    ) -> list[LeaseEvent]:
        """Lease events, newest first, optionally of one route and from `since` on."""
        where, args = _where(route=route, since=since)
        sql = f"SELECT {_EVENT_COLUMNS} FROM lease_events{where} ORDER BY at DESC, id DESC LIMIT ?"
        rows = await self._run("listing events", _query, sql, (*args, max(limit, 0)))
        return [LeaseEvent(*row) for row in rows]

    # -- usage -------------------------------------------------------------------------------

    async def record_usage(self, row: UsageRow) -> None:
        values = astuple(row)  # fields in column order, `stream` stored as 0/1
        sql = f"INSERT INTO usage ({_USAGE_COLUMNS}) VALUES ({', '.join('?' * len(values))})"
        await self._run("recording usage", _execute, sql, values)

    async def usage_totals(self, by: str, since: float | None = None) -> list[dict[str, Any]]:
        """Totals per route, host or model (`by`), sorted by it: requests, errors (status >= 400
        or an error), tokens, and the nearest-rank p50/p95 time to first byte (None when no
        request of the group measured one)."""
        if by not in USAGE_GROUPS:
            raise ValueError(f"usage_totals: by must be one of {USAGE_GROUPS}, not {by!r}")
        where, args = _where(since=since)
        # `by` is one of three column names (checked above), never client text.
        sql = f"""
            WITH picked AS (SELECT * FROM usage{where}),
            totals AS (
                SELECT {by} AS k, COUNT(*) AS requests,
                       SUM(status >= 400 OR error != '') AS errors,
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
        rows = await self._run("summing usage", _query, sql, args)
        names = (by, "requests", "errors", "prompt_tokens", "cached_tokens", "completion_tokens")
        return [
            {**dict(zip(names, row[:6], strict=True)), "ttfb_p50_ms": row[6], "ttfb_p95_ms": row[7]}
            for row in rows
        ]

    async def usage_series(self, since: float, bucket: float) -> list[dict[str, Any]]:
        """Per `bucket` seconds (aligned to multiples of it) and route, from `since` on:
        requests and tokens, oldest bucket first. For the dashboard's chart."""
        if bucket <= 0:
            raise ValueError(f"usage_series: bucket must be positive, not {bucket!r}")
        sql = """
            SELECT CAST(at / ? AS INTEGER) AS b, route, COUNT(*), SUM(prompt_tokens),
                   SUM(cached_tokens), SUM(completion_tokens)
            FROM usage WHERE at >= ? GROUP BY b, route ORDER BY b, route"""
        rows = await self._run("charting usage", _query, sql, (bucket, since))
        return [
            {
                "at": b * float(bucket),
                "route": route,
                "requests": requests,
                "prompt_tokens": prompt,
                "cached_tokens": cached,
                "completion_tokens": completion,
            }
            for b, route, requests, prompt, cached, completion in rows
        ]

    # -- hosts and housekeeping --------------------------------------------------------------

    async def set_draining(self, name: str, draining: bool) -> None:
        """Persist a host's draining flag, durably (the operator is told it is set)."""
        sql = (
            "INSERT INTO host_state (name, draining) VALUES (?, ?) "
            "ON CONFLICT (name) DO UPDATE SET draining = excluded.draining"
        )
        await self._run("saving host state", _write, sql, (name, int(draining)), durable=True)

    async def list_draining(self) -> set[str]:
        rows = await self._run(
            "reading host state", _query, "SELECT name FROM host_state WHERE draining"
        )
        return {name for (name,) in rows}

    async def prune(self, events_before: float, usage_before: float) -> tuple[int, int]:
        """Delete events and usage rows older than the given times; returns (events, usage)."""
        return await self._run("pruning", _prune, events_before, usage_before)


def _apply(txn: Transaction, rows: list[tuple], keys: list[tuple], events: list[tuple]) -> None:
    txn.execute("BEGIN IMMEDIATE")
    txn.executemany("DELETE FROM leases WHERE route = ? AND fp = ? AND model = ?", keys)
    txn.executemany(
        f"INSERT INTO leases ({_LEASE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (route, fp, model) DO UPDATE SET host = excluded.host, "
        "state = excluded.state, created = excluded.created, last_used = excluded.last_used",
        rows,
    )
    txn.executemany(
        f"INSERT INTO lease_events ({_EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)", events
    )


def _durably(conn: Any, fn: Callable[..., T], *args: Any) -> T:
    """Run `fn` as one transaction committed with synchronous = FULL (an fsync of the WAL),
    then go back to NORMAL."""
    conn.execute("PRAGMA synchronous = FULL")
    try:
        cursor = conn.cursor()
        try:
            result = fn(cursor, *args)
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            cursor.close()
        return result
    finally:
        conn.execute("PRAGMA synchronous = NORMAL")


def _touch_version(txn: Transaction) -> None:
    txn.execute("BEGIN IMMEDIATE")
    txn.execute("UPDATE schema_version SET version = version")


def _prune(txn: Transaction, events_before: float, usage_before: float) -> tuple[int, int]:
    txn.execute("BEGIN IMMEDIATE")
    txn.execute("DELETE FROM lease_events WHERE at < ?", (events_before,))
    events = txn.rowcount
    txn.execute("DELETE FROM usage WHERE at < ?", (usage_before,))
    return events, txn.rowcount


def _query(txn: Transaction, sql: str, args: tuple = ()) -> list[tuple]:
    txn.execute(sql, args)
    return txn.fetchall()


def _execute(txn: Transaction, sql: str, args: tuple = ()) -> None:
    txn.execute(sql, args)


def _write(txn: Transaction, sql: str, args: tuple = ()) -> None:
    """One statement as a transaction of its own."""
    txn.execute("BEGIN IMMEDIATE")
    txn.execute(sql, args)


# -- rows ----------------------------------------------------------------------------------


def _where(route: str | None = None, since: float | None = None) -> tuple[str, tuple]:
    clauses, args = [], []
    if route is not None:
        clauses.append("route = ?")
        args.append(route)
    if since is not None:
        clauses.append("at >= ?")
        args.append(since)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(args)


def _lease_row(lease: Lease) -> tuple:
    k = lease.key
    return (k.route, k.fp, k.model, lease.host, lease.state.value, lease.created, lease.last_used)


def _event_row(e: LeaseEvent) -> tuple:
    return astuple(e)
