"""`crossbar migrate-store FROM TO`: copy a stopped crossbar's store to another database.

The usual move is from the SQLite file of one instance to PostgreSQL, to run several. Leases
and pins, draining hosts, lease events, usage rows and sums, client keys and what they spent
are copied, in their order, into an
empty store whose schema is created first; all of it is one transaction on TO, so a failed
copy leaves TO as empty as it was. FROM is only read. The change log and the instances'
heartbeats are not copied: they describe running instances, and there must be none (a lease
made on FROM during the copy would be lost), so a FROM with an instance that beat in the last
minute is refused. Passwords in URLs are never printed.
"""

from __future__ import annotations

import os
from typing import Any

from attrs import frozen

from crossbar.config import redact
from crossbar.store.backends import Backend, backend_for
from crossbar.store.setup import StoreError, connect, diagnose, migrate, migrations

BATCH = 5000
RECENT_HEARTBEAT = 60.0  # seconds: an instance that beat this recently may still be running


@frozen
class _Table:
    name: str
    columns: tuple[str, ...]
    order: str  # the order rows are copied in (events and usage keep theirs)
    label: str
    since: int = 1  # the schema version that made the table
    added: tuple[tuple[str, int], ...] = ()  # columns later versions added, with the version

    def columns_at(self, version: int) -> tuple[str, ...]:
        """The columns a source at schema `version` has."""
        return self.columns + tuple(c for c, since in self.added if version >= since)


_TABLES = (
    _Table("leases", ("route", "fp", "model", "host", "state", "created", "last_used"),
           "route, fp, model", "leases and pins"),
    _Table("host_state", ("name", "draining"), "name", "host states"),
    _Table("lease_events", ("at", "route", "fp", "model", "from_host", "to_host", "reason"),
           "id", "lease events"),
    _Table("usage", ("at", "route", "fp", "model", "host", "path", "status", "stream",
                     "prompt_tokens", "cached_tokens", "completion_tokens", "queue_ms",
                     "ttfb_ms", "duration_ms", "lease", "error"), "id", "usage rows",
           added=(("key", 5), ("fallback_from", 6), ("fallback_reason", 6),
                  ("request_class", 7), ("resumed", 10))),
    _Table("usage_minutes", ("minute", "route", "host", "model", "requests", "errors",
                             "prompt_tokens", "cached_tokens", "completion_tokens"),
           "minute, route, host, model", "per-minute usage sums", since=3, added=(("key", 5),)),
    _Table("usage_hours", ("hour", "route", "host", "model", "requests", "errors",
                           "prompt_tokens", "cached_tokens", "completion_tokens"),
           "hour, route, host, model", "per-hour usage sums", since=3, added=(("key", 5),)),
    _Table("client_keys", ("name", "sha256", "old_sha256", "old_until", "routes", "models",
                           "expires", "blocked", "limits", "created", "source", "seed"),
           "name", "client keys", since=5),
    _Table("key_spend", ("key", "period", "instance", "spent", "starts"),
           "key, period, instance", "key spending rows", since=5),
    _Table("batch_files", ("id", "route", "key", "purpose", "filename", "bytes", "lines",
                           "created", "content"), "id", "batch files", since=8),
    _Table("batches", ("id", "route", "key", "endpoint", "input_file_id", "completion_window",
                       "status", "created", "expires_at", "in_progress_at", "finalizing_at",
                       "completed_at", "failed_at", "expired_at", "cancelling_at",
                       "cancelled_at", "output_file_id", "error_file_id", "errors", "metadata",
                       "total", "ending", "finisher", "finish_until"), "id", "batches", since=8,
           added=(("counts", 9),)),
    _Table("batch_items", ("batch", "line", "custom_id", "grp", "body", "state", "attempts",
                           "claim", "not_before", "prompt_tokens", "cached_tokens",
                           "completion_tokens", "result"), "batch, line", "batch items",
           since=8),
    _Table("batch_events", ("at", "batch", "status", "instance", "detail"), "id",
           "batch events", since=8),
)  # fmt: skip


class MigrateError(Exception):
    """The copy was refused or failed; nothing was written to TO."""


def migrate_store(source: str, target: str) -> list[str]:
    """Copy `source` into the empty store `target`; lines that say what was copied."""
    if source == target:
        raise MigrateError("FROM and TO are the same store")
    for db in (source, target):
        if db == ":memory:":
            raise MigrateError('":memory:" holds nothing after crossbar stops; name a file')
    if backend_for(source).name == "sqlite" and not os.path.exists(source):
        raise MigrateError(f"{source}: no such file (FROM must be an existing store)")
    src = _open(source)
    try:
        _check_source(src, source)
        dst = _open(target)
        try:
            return _copy(src, source, dst, target)
        finally:
            dst.close()
    finally:
        src.close()


def _open(db: str) -> _Conn:
    backend = backend_for(db)
    try:
        conn = connect(backend, db)
    except Exception as e:
        reason = " ".join(diagnose(db, e).split())  # one line: libpq adds hints on the next
        raise MigrateError(f"cannot open {redact(db)}: {reason}") from e
    return _Conn(conn, backend)


class _Conn:
    def __init__(self, conn: Any, backend: Backend) -> None:
        self.conn, self.backend = conn, backend

    def one(self, sql: str, *args: Any) -> Any:
        cur = self.conn.cursor()
        cur.execute(self.backend.sql(sql), args)
        return cur.fetchone()

    def close(self) -> None:
        self.conn.close()


def _check_source(src: _Conn, source: str) -> None:
    try:
        (version,) = src.one("SELECT version FROM schema_version")
    except Exception as e:
        raise MigrateError(f"{redact(source)} is not a crossbar store ({_reason(e)})") from e
    latest = migrations()[-1][0]
    if version > latest:
        raise MigrateError(
            f"{redact(source)} has schema version {version}, newer than this crossbar's "
            f"{latest}; run the newer crossbar's migrate-store"
        )
    if version >= 2:  # the instances table
        row = src.one(
            f"SELECT id, {src.backend.epoch_now} - heartbeat FROM instances "
            "ORDER BY heartbeat DESC LIMIT 1"
        )
        if row is not None and row[1] < RECENT_HEARTBEAT:
            raise MigrateError(
                f"crossbar instance {row[0]} wrote a heartbeat to {redact(source)} "
                f"{max(0.0, row[1]):.0f} s ago: stop every crossbar using it first (a lease "
                "made during the copy would be lost)"
            )


def _copy(src: _Conn, source: str, dst: _Conn, target: str) -> list[str]:
    try:
        migrate(dst.conn, dst.backend)  # opens TO's transaction; everything below is in it
        for table in _TABLES:
            (n,) = dst.one(f"SELECT COUNT(*) FROM {table.name}")
            if n:
                raise MigrateError(
                    f"{redact(target)} already holds {n} {table.label}: migrate-store copies "
                    "into an empty store only"
                )
        (version,) = src.one("SELECT version FROM schema_version")
        counts = [(t, _copy_table(src, dst, t, version)) for t in _TABLES if version >= t.since]
        if version >= 3:  # how far the sums reach, and from when raw rows are kept
            bounds = src.one("SELECT rolled_until, hours_until, raw_from FROM usage_rollup")
            cur = dst.conn.cursor()
            sql = "UPDATE usage_rollup SET rolled_until = ?, hours_until = ?, raw_from = ?"
            cur.execute(dst.backend.sql(sql), tuple(bounds))
        dst.conn.commit()
    except MigrateError:
        dst.conn.rollback()
        raise
    except (StoreError, *src.backend.errors, *dst.backend.errors) as e:
        dst.conn.rollback()
        raise MigrateError(f"copy failed, nothing was written to {redact(target)}: "
                           f"{_reason(e)}") from e  # fmt: skip
    lines = [f"copied {redact(source)} to {redact(target)}:"]
    lines += [f"  {n:,} {table.label}" for table, n in counts]
    return lines


def _copy_table(src: _Conn, dst: _Conn, table: _Table, version: int) -> int:
    names = table.columns_at(version)
    columns = ", ".join(names)
    read = src.conn.cursor()
    read.execute(f"SELECT {columns} FROM {table.name} ORDER BY {table.order}")
    marks = ", ".join("?" for _ in names)
    insert = dst.backend.sql(f"INSERT INTO {table.name} ({columns}) VALUES ({marks})")
    write = dst.conn.cursor()
    copied = 0
    while rows := read.fetchmany(BATCH):
        write.executemany(insert, [tuple(row) for row in rows])
        copied += len(rows)
    return copied


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return text or error.__class__.__name__
