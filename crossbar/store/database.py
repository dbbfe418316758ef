"""crossbar's store (docs/reference.md, "Store"): leases and pins, lease events, usage rows,
drained hosts, and what several instances share: the change log and their heartbeats.

SQLite (one file, WAL) or PostgreSQL (backends.py), through `twisted.enterprise.adbapi`
with one writing connection on one thread, so writes complete in the order they were
submitted; lease changes and usage rows go in group commits (group.py). The admin API's
reports read on a second connection of their own (SQLite's WAL lets a reader work beside the
writer), so a long report never delays a lease write, nor waits behind one. Functions run in
those threads never touch the reactor. Opening and migrations: setup.py; the lease
table's writes: `write` here, the conditions explained on `crossbar.leases.Change`.
"""

from __future__ import annotations

import math
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from attrs import astuple, fields, frozen
from twisted.enterprise.adbapi import ConnectionPool, Transaction
from twisted.internet.interfaces import IReactorCore
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger

from crossbar.config import redact
from crossbar.leases import Change, Key, Lease, State, Written
from crossbar.records import LeaseEvent, UsageRow
from crossbar.store import batch_claims, batch_ends, batches
from crossbar.store.backends import (
    REPORT_TIMEOUT,
    SQLITE,
    STORE_TIMEOUT,
    Backend,
    backend_for,
    begin,
)
from crossbar.store.batch_claims import Claim, Ended
from crossbar.store.batches import BatchEvent, BatchRow, BatchTally, ErrorLine, FileRow, NewItem
from crossbar.store.group import GroupCommit, write_group
from crossbar.store.keys import (
    create_key,
    delete_key,
    read_keys,
    save_key,
    seed_keys,
    sync_spend,
)
from crossbar.store.reports import Pick, top_moves_rows, usage_series_rows, usage_totals_rows
from crossbar.store.rollups import RolledUp, roll_up
from crossbar.store.settled import SettledRows
from crossbar.store.setup import StoreError, check, diagnose, init_connection, migrate, shut
from crossbar.store.writes import ChangeRow, read_changes, write_draining
from crossbar.tenants import ClientKey

__all__ = ["USAGE_GROUPS", "ChangeRow", "Store", "StoreError", "check"]

T = TypeVar("T")
log = Logger(namespace="crossbar.store")

USAGE_GROUPS = ("route", "host", "model", "key")
_LEASE_COLUMNS = "route, fp, model, host, state, created, last_used"
_EVENT_COLUMNS = ", ".join(a.name for a in fields(LeaseEvent))
_USAGE_COLUMNS = ", ".join(a.name for a in fields(UsageRow))
_STATES = {s.value: s for s in State}  # a dict lookup; State(value) is slower
_USAGE_INSERT = (
    f"INSERT INTO usage ({_USAGE_COLUMNS}) VALUES ({', '.join('?' * len(fields(UsageRow)))})"
)


@frozen
class InstanceRow:
    """One crossbar instance as the store knows it; `heartbeat` on the database's clock."""

    id: str
    address: str
    version: str
    digest: str
    started: float
    heartbeat: float
    in_flight: int
    slots: str = ""  # its requests in flight per (host, model): JSON {"host\tmodel": n}


class Store:
    """The database. Open it with `await Store.open(db, reactor)`; every method is async."""

    def __init__(
        self,
        pool: ConnectionPool,
        db: str,
        reactor: IReactorCore,
        backend: Backend,
        instance: str,
        reader: ConnectionPool | None = None,
    ) -> None:
        """`reader`: the reports' connection (None: they share the writer's, as ":memory:"
        must, being one database per connection)."""
        self._pool = pool
        self._reader = reader
        self.group = GroupCommit(self._write_group)
        self._reactor = reactor
        self._backend = backend
        self.db = db
        self.path = redact(db)  # what may be shown: no password
        self.instance = instance  # who writes: the change log says so
        self.settled = SettledRows()  # report rows over settled usage, between refreshes
        self._closed = False
        # Usage rows dropped for values no column holds (`unstorable`), per reason.
        self.dropped_rows: Counter[str] = Counter()

    @classmethod
    async def open(
        cls, db: str, reactor: IReactorCore, instance: str = "", statements: float = STORE_TIMEOUT
    ) -> Store:
        """Open (creating if needed) and migrate the store at `db`: an SQLite path
        (":memory:" allowed) or a PostgreSQL URL. `instance` names this crossbar in the
        change log; `statements` bounds each statement, in seconds (`server.store_timeout`;
        reports get longer). Raises StoreError saying why it cannot be opened, read or written."""
        backend = backend_for(db)
        memory = db == ":memory:"

        def openfun(timeout: float) -> Any:
            if backend is not SQLITE:
                return None
            return lambda conn: init_connection(conn, memory, timeout)

        pool = backend.pool(db, reactor, openfun(statements), statements)
        try:
            await pool.runWithConnection(migrate, backend)
        except Exception as e:
            reason = await deferToThreadPool(reactor, pool.threadpool, diagnose, db, e)
            await shut(pool, reactor)
            raise StoreError(f"cannot open the store {redact(db)}: {reason}") from e
        reports = max(REPORT_TIMEOUT, statements)
        reader = None if memory else backend.pool(db, reactor, openfun(reports), reports)
        return cls(pool, db, reactor, backend, instance, reader)

    @property
    def backend(self) -> Backend:
        return self._backend

    async def close(self) -> None:
        """Close the connection (in its own thread) and stop the pool."""
        if not self._closed:
            self._closed = True
            if self._reader is not None:
                await shut(self._reader, self._reactor)
            await shut(self._pool, self._reactor)

    async def _run(self, what: str, fn: Callable[..., T], *args: Any, durable: bool = False) -> T:
        if self._closed:
            raise StoreError(f"store {self.path}: {what} after close")
        sync = durable and self._backend is SQLITE
        return self._result(what, await self._in(what, self._pool, sync, fn, *args))

    async def _in(
        self, what: str, pool: ConnectionPool, durable: bool, fn: Callable[..., T], *args: Any
    ) -> Any:
        """`fn` as one transaction on `pool`'s connection, in its thread (_transaction)."""
        errors = self._backend.errors
        try:
            return await pool.runWithConnection(_transaction, errors, durable, fn, *args)
        except errors as e:  # the pool's own commit or reconnect, after _transaction's end
            raise StoreError(f"store {self.path}: {what} failed: {e}") from None

    def _result(self, what: str, outcome: Any) -> Any:
        if isinstance(outcome, _Failed):
            if outcome.bug:
                raise RuntimeError(f"store {self.path}: {what} failed:\n{outcome.message}")
            raise StoreError(f"store {self.path}: {what} failed: {outcome.message}")
        return outcome

    async def _query(self, what: str, sql: str, args: tuple = ()) -> list[tuple]:
        return await self._run(what, _query, self._backend.sql(sql), args)

    async def _read(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """A report for the admin API, on the reader's connection: never behind a write."""
        if self._reader is None:
            return await self._run(what, fn, *args)
        if self._closed:
            raise StoreError(f"store {self.path}: {what} after close")
        return self._result(what, await self._in(what, self._reader, False, fn, *args))

    def _write_group(self, items: list, durable: bool, what: str) -> Any:
        args = (self._backend, self.instance, self._backend.sql(_USAGE_INSERT), items)
        return self._run(what, write_group, *args, durable=durable)

    # -- leases ------------------------------------------------------------------------------

    async def write(self, change: Change, durable: bool = False) -> Written:
        """Write a change of the lease table in one transaction (with its change-log rows):
        all of it or, when its `expect` fails, none. `durable`: synced to disk before it
        returns, for what an operator is told is done."""
        if not (change.save or change.delete or change.events):
            return Written()
        if self._closed:
            raise StoreError(f"store {self.path}: saving leases after close")
        return await self.group.lease(change, durable)

    async def apply(
        self,
        save: Iterable[Lease] = (),
        delete: Iterable[Key] = (),
        events: Iterable[LeaseEvent] = (),
        durable: bool = False,
    ) -> None:
        """Save (upsert) and delete leases and record events, unconditionally."""
        await self.write(Change(list(save), list(delete), list(events)), durable)

    async def ping(self) -> None:
        """A write that changes nothing: raises StoreError while the store cannot be written."""
        await self._run("checking the store", _touch_version, self._backend)

    async def list_leases(self) -> list[Lease]:
        """Every lease and pin row."""
        rows = await self._query("listing leases", f"SELECT {_LEASE_COLUMNS} FROM leases")
        return [
            Lease(Key(route, fp, model), host, _STATES[state], created, last_used)
            for route, fp, model, host, state, created, last_used in rows
        ]

    async def last_change(self) -> int:
        """The number of the newest change-log row (read before the leases at start: what
        comes after it, the follower applies)."""
        ((n,),) = await self._query("reading the change log", "SELECT n FROM change_counter")
        return n

    async def changes_since(self, after: int, limit: int = 1000) -> list[ChangeRow]:
        """Change-log rows numbered after `after`, oldest first."""
        return await self._run("reading the change log", read_changes, self._backend, after, limit)

    async def list_events(
        self, route: str | None = None, since: float | None = None, limit: int = 100
    ) -> list[LeaseEvent]:
        """Lease events, newest first, optionally of one route and from `since` on."""
        where, args = _where(route=route, since=since)
        sql = f"SELECT {_EVENT_COLUMNS} FROM lease_events{where} ORDER BY at DESC, id DESC LIMIT ?"
        sql = self._backend.sql(sql)
        rows = await self._read("listing events", _query, sql, (*args, max(limit, 0)))
        return [LeaseEvent(*row) for row in rows]

    # -- usage -------------------------------------------------------------------------------

    async def record_usage(self, row: UsageRow) -> None:
        """Write one usage row."""
        await self.record_usage_rows([row])

    async def record_usage_rows(self, rows: list[UsageRow]) -> None:
        """Write usage rows in one transaction (one commit for the lot)."""
        if not rows:
            return
        if self._closed:
            raise StoreError(f"store {self.path}: recording usage after close")
        values = []
        for row in rows:
            row_values = _usage_values(row)
            why = unstorable(row_values)
            if why:
                self._drop(row, why)
            else:
                values.append(row_values)
        if values:
            await self.group.usage(values)

    def _drop(self, row: UsageRow, why: str) -> None:
        """A row no database column can hold is dropped, never retried: tried with every
        group, it once kept the store degraded until a restart."""
        self.dropped_rows[why] += 1
        log.warn(
            "usage row of route {route} host {host} dropped: {why} (the database cannot hold it)",
            route=row.route,
            host=row.host,
            why=why,
        )

    async def usage_totals(
        self,
        by: str,
        since: float | None = None,
        percentiles: bool = True,
        pick: Pick | None = None,
    ) -> list[dict[str, Any]]:
        """Totals per route, host or model (`by`), sorted by it: requests, errors (status >= 400
        or an error), tokens, and the nearest-rank p50/p95 time to first byte over the raw rows
        (None when no request of the group measured one, or `percentiles` is false). `pick`
        (run in the store's thread) keeps some rows, a top ten, before percentiles are read."""
        if by not in USAGE_GROUPS:
            raise ValueError(f"usage_totals: by must be one of {USAGE_GROUPS}, not {by!r}")
        args = (self._backend, by, since, percentiles, pick, self.settled)
        return await self._read("summing usage", usage_totals_rows, *args)

    async def usage_series(
        self, since: float, bucket: float, top: int | None = None
    ) -> list[dict[str, Any]]:
        """Per `bucket` seconds (aligned to multiples of it) and route, from `since` on:
        requests and tokens, oldest bucket first. For the dashboard's chart; with `top`, the
        `top` routes with the most tokens and the rest summed as route "(other)"."""
        if bucket <= 0:
            raise ValueError(f"usage_series: bucket must be positive, not {bucket!r}")
        args = (self._backend, since, bucket, top, self.settled)
        return await self._read("charting usage", usage_series_rows, *args)

    async def top_moves(self, since: float, limit: int) -> list[dict[str, Any]]:
        """The conversations moved between hosts most often since `since`, most first."""
        return await self._read("counting moves", top_moves_rows, self._backend, since, limit)

    async def roll_up(self, now: float, raw_before: float) -> RolledUp:
        """Sum whole minutes of usage rows into per-minute and per-hour rows (an hour's worth
        at most), then delete the raw rows before `raw_before` that are summed."""
        # The settled rows kept for reports stay right: a roll-up adds sums after the old
        # rolled_until and deletes only raw rows already summed, and the reports' queries
        # name their bounds, which move with it.
        return await self._run("rolling up usage", roll_up, self._backend, now, raw_before)

    # -- client keys ---------------------------------------------------------------------------

    async def list_keys(self, names: Iterable[str] | None = None) -> list[ClientKey]:
        """Every client key (or those of `names` that exist), by name."""
        names = None if names is None else list(names)
        return await self._run("reading client keys", read_keys, self._backend, names)

    async def seed_keys(self, seeds: list[ClientKey]) -> list[ClientKey]:
        """Write the config's keys where their config entries changed, delete config keys the
        config dropped (tenants.from_config, store/keys.py); every key after."""
        args = (self._backend, self.instance, seeds)
        return await self._run("seeding client keys", seed_keys, *args, durable=True)

    async def create_key(self, key: ClientKey) -> bool:
        """Insert a new key, durably; False when the name is taken."""
        args = (self._backend, self.instance, key)
        return await self._run("creating a client key", create_key, *args, durable=True)

    async def save_key(self, key: ClientKey) -> None:
        """Write a changed key (blocked, unblocked, rotated), durably."""
        args = (self._backend, self.instance, key)
        await self._run("saving a client key", save_key, *args, durable=True)

    async def delete_key(self, name: str) -> bool:
        """Delete a key, durably; False when there was none."""
        args = (self._backend, self.instance, name)
        return await self._run("deleting a client key", delete_key, *args, durable=True)

    async def sync_spend(
        self, rows: list[tuple[str, str, float, float]], periods: list[str]
    ) -> dict[tuple[str, str], float]:
        """Write this instance's spending per (key, period) and read the others'."""
        args = (self._backend, self.instance, rows, periods)
        return await self._run("syncing key spending", sync_spend, *args)

    # -- the Batch API (batches.py) -----------------------------------------------------------

    async def add_file(self, row: FileRow, content: str) -> None:
        """Store a file, durably (its client is told it is kept)."""
        await self._run(
            "storing a file", batches.add_file, self._backend, row, content, durable=True
        )

    async def read_file(self, file_id: str) -> FileRow | None:
        return await self._read("reading a file", batches.read_file, self._backend, file_id)

    async def file_content(self, file_id: str) -> str | None:
        return await self._read("reading a file", batches.file_content, self._backend, file_id)

    async def list_files(
        self, route: str, key: str, purpose: str, after: str, limit: int
    ) -> list[FileRow]:
        args = (self._backend, route, key, purpose, after, limit)
        return await self._read("listing files", batches.list_files, *args)

    async def delete_file(self, file_id: str) -> bool:
        args = (self._backend, file_id)
        return await self._run("deleting a file", batches.delete_file, *args, durable=True)

    async def create_batch(self, row: BatchRow, items: list[NewItem]) -> None:
        """A batch with all its items, durably."""
        args = (self._backend, self.instance, row, items)
        await self._run("creating a batch", batches.create_batch, *args, durable=True)

    async def read_batch(self, batch_id: str) -> BatchRow | None:
        return await self._read("reading a batch", batches.read_batch, self._backend, batch_id)

    async def list_batches(
        self, route: str | None, key: str | None, after: str, limit: int
    ) -> list[BatchRow]:
        args = (self._backend, route, key, after, limit)
        return await self._read("listing batches", batches.list_batches, *args)

    async def batch_page(
        self, route: str | None, key: str | None, status: str | None, after: str, limit: int
    ) -> list[BatchRow]:
        """Batches newest first, of every route and key unless one is given, for the admin
        API (on the reports' connection: counting a page's items never holds a write up)."""
        args = (self._backend, route, key, after, limit, status)
        return await self._read("listing batches", batches.list_batches, *args)

    async def batch_report(
        self, batch_id: str, events: int
    ) -> tuple[BatchRow | None, list[BatchEvent]]:
        """A batch and its latest `events` events, newest first (on the reports' connection)."""
        args = (self._backend, batch_id, events)
        return await self._read("reading a batch", batches.batch_report, *args)

    async def batch_tally(self) -> BatchTally:
        """Batches by status, and the items of those not ended by state (on the reports'
        connection; the batch runner reads it each second for /metrics)."""
        return await self._read("counting batches", batches.tally, self._backend)

    async def cancel_batch(self, batch_id: str, now: float, lines: ErrorLine) -> str | None:
        args = (self._backend, self.instance, batch_id, now, lines)
        return await self._run("cancelling a batch", batch_ends.cancel_batch, *args, durable=True)

    async def any_batch_running(self) -> bool:
        """Whether some batch has not ended (on the reports' connection: never behind a write)."""
        return await self._read("reading batches", batches.any_running, self._backend)

    async def claim_items(self, token: str, now: float, until: float, limit: int) -> list[Claim]:
        args = (self._backend, token, now, until, limit)
        return await self._run("claiming batch items", batch_claims.claim_items, *args)

    async def renew_claims(self, token: str, until: float) -> int:
        args = (self._backend, token, until)
        return await self._run("renewing batch claims", batch_claims.renew_claims, *args)

    async def end_items(self, token: str, ended: list[Ended]) -> list[bool]:
        args = (self._backend, token, ended)
        return await self._run("writing batch results", batch_claims.end_items, *args)

    async def retry_item(self, token: str, batch: str, line: int, when: float, count: bool) -> bool:
        args = (self._backend, token, batch, line, when, count)
        return await self._run("retrying a batch item", batch_claims.retry_item, *args)

    async def release_claims(self, token: str) -> int:
        args = (self._backend, token)
        return await self._run("releasing batch claims", batch_claims.release_claims, *args)

    async def close_ending(self, now: float, lines: ErrorLine) -> list[str]:
        args = (self._backend, self.instance, now, lines)
        return await self._run("ending batches", batch_ends.close_ending, *args)

    async def start_finalizing(self, now: float, until: float) -> list[str]:
        args = (self._backend, self.instance, now, until)
        return await self._run("finalizing batches", batch_ends.start_finalizing, *args)

    async def finish_batch(
        self, batch_id: str, now: float, output: FileRow, error: FileRow
    ) -> str | None:
        args = (self._backend, self.instance, batch_id, now, output, error)
        return await self._run("finishing a batch", batch_ends.finish_batch, *args, durable=True)

    async def batch_events(self, batch: str | None, limit: int) -> list[BatchEvent]:
        args = (self._backend, batch, limit)
        return await self._read("reading batch events", batches.list_events, *args)

    async def prune_batches(self, before: float) -> int:
        args = (self._backend, before)
        return await self._run("pruning batches", batch_ends.prune_batches, *args)

    # -- hosts, instances and housekeeping ---------------------------------------------------

    async def set_draining(self, name: str, draining: bool) -> None:
        """Persist a host's draining flag, durably (the operator is told it is set)."""
        args = (self._backend, self.instance, name, draining)
        await self._run("saving host state", write_draining, *args, durable=True)

    async def list_draining(self) -> set[str]:
        rows = await self._query(
            "reading host state", "SELECT name FROM host_state WHERE draining = 1"
        )
        return {name for (name,) in rows}

    async def heartbeat(self, row: InstanceRow) -> tuple[float, list[InstanceRow]]:
        """Say this instance is alive (its row, heartbeat set to the database's clock); the
        database's time and every instance's row."""
        return await self._run("heartbeat", _heartbeat, self._backend, row)

    async def forget_instance(self, instance: str) -> None:
        """This instance stops: others need not wait for its heartbeats to run out."""
        sql = self._backend.sql("DELETE FROM instances WHERE id = ?")
        await self._run("leaving", _write, self._backend, sql, (instance,))

    async def prune(
        self, events_before: float, usage_before: float, changes_before: float = 0.0
    ) -> tuple[int, int]:
        """Delete events, usage rows and change-log rows older than the given times (and
        instances silent for a day); returns (events, usage rows) deleted."""
        args = (self._backend, events_before, usage_before, changes_before)
        events, usage, sums = await self._run("pruning", _prune, *args)
        if usage or sums:
            self.settled.clear()  # settled usage was deleted: rows kept may count it
        return events, usage


# -- in the pool's thread ------------------------------------------------------------------


@frozen
class _Failed:
    """A store call that failed in the store's thread, told as text: all that crosses back."""

    message: str
    bug: bool = False  # not the database's failure: crossbar's own (a traceback as text)


def _transaction(
    conn: Any,
    errors: tuple[type[BaseException], ...],
    durable: bool,
    fn: Callable[..., T],
    *args: Any,
) -> T | _Failed:
    """Run `fn` on a cursor as one transaction, in the store's thread, and finish with it
    there: commit, or roll back and return only the failure's text. `durable` (SQLite): the
    commit syncs the WAL (synchronous = FULL), then NORMAL again.

    Nothing of the database may be finalised on the reactor thread: an exception carried back
    keeps its traceback, its frames keep the cursor, and a cursor freed there (by the garbage
    collector, when the reactor thread drops the failure) waits for the connection's lock,
    which this thread holds while it waits out busy_timeout on a file another process has
    locked. Every request then stalled for seconds (docs/reference.md, "Store")."""
    if durable:
        conn.execute("PRAGMA synchronous = FULL")
    cursor = conn.cursor()
    failed: _Failed | None = None
    try:
        result = fn(cursor, *args)
        conn.commit()
    except errors as e:
        failed = _Failed(str(e) or type(e).__name__)
    except Exception:
        failed = _Failed(traceback.format_exc(), bug=True)
    finally:
        cursor.close()
    if failed is None:
        if durable:
            conn.execute("PRAGMA synchronous = NORMAL")
        return result
    try:
        conn.rollback()
        if durable:
            conn.execute("PRAGMA synchronous = NORMAL")
    except Exception:
        pass
    return failed


def _touch_version(txn: Transaction, backend: Backend) -> None:
    begin(txn, backend)
    txn.execute("UPDATE schema_version SET version = version")


def _heartbeat(
    txn: Transaction, backend: Backend, row: InstanceRow
) -> tuple[float, list[InstanceRow]]:
    begin(txn, backend)
    txn.execute(f"SELECT {backend.epoch_now}")
    (now,) = txn.fetchone()
    txn.execute(
        backend.sql(
            "INSERT INTO instances (id, address, version, digest, started, heartbeat, in_flight, "
            "slots) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
            "address = excluded.address, version = excluded.version, digest = excluded.digest, "
            "heartbeat = excluded.heartbeat, in_flight = excluded.in_flight, "
            "slots = excluded.slots"
        ),
        (row.id, row.address, row.version, row.digest, row.started, now, row.in_flight, row.slots),
    )
    txn.execute(
        "SELECT id, address, version, digest, started, heartbeat, in_flight, slots "
        "FROM instances ORDER BY id"
    )
    return now, [InstanceRow(*r) for r in txn.fetchall()]


def _prune(
    txn: Transaction,
    backend: Backend,
    events_before: float,
    usage_before: float,
    changes_before: float,
) -> tuple[int, int, int]:
    begin(txn, backend)
    txn.execute(backend.sql("DELETE FROM lease_events WHERE at < ?"), (events_before,))
    events = txn.rowcount
    txn.execute(backend.sql("DELETE FROM usage WHERE at < ?"), (usage_before,))
    usage = txn.rowcount
    txn.execute(backend.sql("DELETE FROM usage_minutes WHERE minute < ?"), (usage_before,))
    sums = txn.rowcount
    txn.execute(backend.sql("DELETE FROM usage_hours WHERE hour < ?"), (usage_before,))
    sums += txn.rowcount
    txn.execute(backend.sql("DELETE FROM changes WHERE at < ?"), (changes_before,))
    txn.execute(f"DELETE FROM instances WHERE heartbeat < {backend.epoch_now} - 86400")
    return events, usage, sums


def _query(txn: Transaction, sql: str, args: tuple = ()) -> list[tuple]:
    txn.execute(sql, args)
    return txn.fetchall()


# The narrowest integer column of a usage row: PostgreSQL's INTEGER (SQLite's is 64-bit).
_INT_RANGE = (-(2**31), 2**31 - 1)
UNSTORABLE = ("integer_out_of_range", "number_not_finite", "text_not_storable")


def unstorable(values: tuple) -> str:
    """Why a usage row's column values cannot be written (one of UNSTORABLE), "" when they
    can: an integer past the column, a NaN or infinite time, text with a NUL (PostgreSQL
    refuses it) or a lone surrogate (no UTF-8 encodes it)."""
    low, high = _INT_RANGE
    for value in values:
        if isinstance(value, int):
            if not low <= value <= high:
                return "integer_out_of_range"
        elif isinstance(value, float):
            if not math.isfinite(value):
                return "number_not_finite"
        elif isinstance(value, str) and not value.isascii():
            try:
                value.encode()
            except UnicodeEncodeError:
                return "text_not_storable"
        if isinstance(value, str) and "\x00" in value:
            return "text_not_storable"
    return ""


def _usage_values(row: UsageRow) -> tuple:
    values = astuple(row)  # fields in column order, `stream` stored as 0/1
    return (*values[:7], int(row.stream), *values[8:])


def _write(txn: Transaction, backend: Backend, sql: str, args: tuple = ()) -> None:
    """One statement as a transaction of its own."""
    begin(txn, backend)
    txn.execute(sql, args)


def _where(route: str | None = None, since: float | None = None) -> tuple[str, tuple]:
    clauses, args = [], []
    if route is not None:
        clauses.append("route = ?")
        args.append(route)
    if since is not None:
        clauses.append("at >= ?")
        args.append(since)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(args)
