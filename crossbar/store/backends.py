"""The two databases crossbar's store runs on, and what differs between them.

`server.db` is an SQLite file (the default: one machine, one or several crossbar processes
sharing it in WAL mode) or a PostgreSQL URL (`postgresql://user:pass@host:5432/db`, query
options such as `sslmode` passed through): several machines. The store writes the same SQL
to both; a `Backend` says how to connect, how to mark parameters, how to begin a write, and
the few expressions that differ. A URL's password never leaves the store: `redact`
(config/redaction.py) is what logs, errors, `crossbar check` and the admin API show.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from attrs import frozen
from twisted.enterprise.adbapi import ConnectionLost, ConnectionPool

from crossbar.config import is_postgres

# The longest one statement may take, unless `server.store_timeout` says otherwise: SQLite's
# busy_timeout (another process, a backup or another crossbar, may hold its lock), PostgreSQL's
# statement_timeout and lock_timeout, connect_timeout and tcp_user_timeout. A store that takes
# longer fails the statement, and crossbar goes on from memory (leases/journal.py).
STORE_TIMEOUT = 5.0
# Reports (the admin API's reader connection) may read a month of usage.
REPORT_TIMEOUT = 30.0


def _postgres_errors() -> tuple[type[BaseException], ...]:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - a test dependency and a runtime one
        return ()
    return (psycopg.Error,)


@frozen
class Backend:
    """What the store needs to know of one database engine."""

    name: str
    begin_write: str  # the statement that opens a write transaction ("" when implicit)
    greatest: str  # the two-argument maximum
    epoch_now: str  # the database's own clock, seconds since the epoch
    id_column: str  # an integer primary key that numbers rows as they come
    time_column: str  # seconds since the epoch, double precision
    without_rowid: str  # SQLite's clustered tables; nothing elsewhere
    placeholder: str

    def sql(self, text: str) -> str:
        """`text` written with `?` parameters, in this engine's parameter style."""
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)

    def schema(self, text: str) -> str:
        """A migration written with {id}, {time} and {without_rowid}, for this engine."""
        return (
            text.replace("{id}", self.id_column)
            .replace("{time}", self.time_column)
            .replace("{without_rowid}", self.without_rowid)
        )

    @property
    def errors(self) -> tuple[type[BaseException], ...]:
        """Exceptions that mean "the database failed" (mapped to StoreError)."""
        if self.name == "sqlite":
            return (sqlite3.Error, ConnectionLost)
        return (*_postgres_errors(), ConnectionLost)

    def pool(
        self, db: str, reactor: Any, openfun: Any, timeout: float = STORE_TIMEOUT
    ) -> ConnectionPool:
        """One connection on a thread of its own: writes complete in the order they were
        submitted, and SQLite's ":memory:" stays one database. `timeout` bounds each of its
        statements on PostgreSQL (SQLite's is set by `openfun`, setup.init_connection)."""
        if self.name == "sqlite":
            return ConnectionPool(
                "sqlite3",
                db,
                cp_min=1,
                cp_max=1,
                check_same_thread=False,
                isolation_level=None,  # autocommit; write interactions BEGIN explicitly
                cp_openfun=openfun,
                cp_reactor=reactor,
            )
        return ConnectionPool(
            "psycopg",
            db,
            cp_min=1,
            cp_max=1,
            cp_reconnect=True,  # a database that went away and came back is used again
            cp_openfun=openfun,
            cp_reactor=reactor,
            **postgres_defaults(db, timeout),
        )


# A database that stops answering (a network partition, a host gone without a reset, a table
# lock held for minutes) must fail the store's one connection within seconds, not hang it:
# libpq's connect and TCP user timeouts and keepalives, the server's statement and lock
# timeouts. A URL that sets any of these keeps its own value.
_POSTGRES_DEFAULTS = {
    "application_name": "crossbar",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
}


def postgres_defaults(db: str, timeout: float = STORE_TIMEOUT) -> dict[str, str]:
    """The connection parameters crossbar adds to a PostgreSQL URL that does not set them;
    `timeout` (seconds) bounds connecting, unacknowledged sends and each statement."""
    from psycopg.conninfo import conninfo_to_dict

    given = conninfo_to_dict(db)
    ms = str(max(1, round(timeout * 1000)))
    wanted = {
        **_POSTGRES_DEFAULTS,
        "connect_timeout": str(max(2, round(timeout))),  # libpq's minimum is 2 s
        "tcp_user_timeout": ms,
        "options": f"-c statement_timeout={ms} -c lock_timeout={ms}",
    }
    return {k: v for k, v in wanted.items() if k not in given}


SQLITE = Backend(
    name="sqlite",
    begin_write="BEGIN IMMEDIATE",  # take the write lock now: no deadlock between processes
    greatest="MAX",
    epoch_now="(julianday('now') - 2440587.5) * 86400.0",
    id_column="INTEGER PRIMARY KEY",
    time_column="REAL",
    without_rowid="WITHOUT ROWID",
    placeholder="?",
)
POSTGRES = Backend(
    name="postgres",
    begin_write="",  # psycopg opens a transaction with the first statement
    greatest="GREATEST",
    epoch_now="EXTRACT(EPOCH FROM clock_timestamp())::double precision",
    id_column="BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
    time_column="DOUBLE PRECISION",
    without_rowid="",
    placeholder="%s",
)


def backend_for(db: str) -> Backend:
    """The engine `server.db` names."""
    return POSTGRES if is_postgres(db) else SQLITE


def begin(txn: Any, backend: Backend) -> None:
    """Open a write transaction as `backend` opens one (SQLite takes its write lock now)."""
    if backend.begin_write:
        txn.execute(backend.begin_write)
