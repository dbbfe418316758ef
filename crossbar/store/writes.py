"""The store's writes of leases and draining flags, and the change log that carries them to the
other instances sharing the store. Each function runs in the store's thread as one transaction.

Every row written to `leases` or `host_state` is also a row of `changes`, numbered from
`change_counter`: the UPDATE of that one row serialises the writers of every instance, so the
numbers follow commit order and a reader that has seen number n has seen everything before it.
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import frozen
from twisted.enterprise.adbapi import Transaction

from crossbar.leases import Change, Key, Lease, State, Written
from crossbar.store.backends import Backend

_LEASE_COLUMNS = "route, fp, model, host, state, created, last_used"
_KEY = "route = ? AND fp = ? AND model = ?"
_STATES = {s.value: s for s in State}


@frozen
class ChangeRow:
    """One row of the change log: a lease (or pin) row's new state, or a draining flag."""

    id: int
    instance: str  # who wrote it
    kind: str  # "lease" or "drain"
    route: str  # for "drain": the host's name
    fp: str
    model: str
    host: str  # "" when the lease was deleted, or the host undrained
    state: str
    created: float
    last_used: float

    def lease(self) -> Lease | None:
        """The lease (or pin) row this change leaves, or None when it deleted it."""
        if self.kind != "lease" or not self.host:
            return None
        key = Key(self.route, self.fp, self.model)
        return Lease(key, self.host, _STATES[self.state], self.created, self.last_used)


def _row(lease: Lease) -> tuple:
    k = lease.key
    return (k.route, k.fp, k.model, lease.host, lease.state.value, lease.created, lease.last_used)


def _key(key: Key) -> tuple:
    return (key.route, key.fp, key.model)


def write_change(
    txn: Transaction, backend: Backend, instance: str, change: Change, begin: bool = True
) -> Written:
    """See `Change`: the conditional part first, so a failed condition writes nothing.
    `begin`: open the write transaction (not when it is one of a group, group.py)."""
    if begin and backend.begin_write:
        txn.execute(backend.begin_write)
    saves = list(change.save)
    if change.expect is not None:
        key, had = change.expect
        (lease,) = [x for x in saves if x.key == key]
        if not _conditional(txn, backend, lease, had):
            return Written(applied=False, current=_current(txn, backend, key))
        saves.remove(lease)
    upsert = (
        f"INSERT INTO leases ({_LEASE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (route, fp, model) DO UPDATE SET host = excluded.host, "
        "state = excluded.state, created = excluded.created, last_used = excluded.last_used"
    )
    if saves:
        txn.executemany(backend.sql(upsert), [_row(x) for x in saves])
    kept: set[Key] = set()
    deleted = list(change.delete)
    if change.idle_before is not None:
        kept = _delete_idle(txn, backend, change.delete, change.idle_before)
        deleted = [key for key in deleted if key not in kept]
    elif deleted:
        txn.executemany(backend.sql(f"DELETE FROM leases WHERE {_KEY}"), map(_key, deleted))
    events = [e for e in change.events if Key(e.route, e.fp, e.model) not in kept]
    if events:
        columns = "at, route, fp, model, from_host, to_host, reason"
        sql = f"INSERT INTO lease_events ({columns}) VALUES (?, ?, ?, ?, ?, ?, ?)"
        # Fields by hand: attrs' astuple (recursive, generic) cost a sweep's batch milliseconds of
        # this thread holding the GIL the reactor waits for.
        rows = [(e.at, e.route, e.fp, e.model, e.from_host, e.to_host, e.reason) for e in events]
        txn.executemany(backend.sql(sql), rows)
    at = max([e.at for e in change.events] + [x.last_used for x in change.save] + [0.0])
    logged = [(x.key, x.host, x.state.value, x.created, x.last_used) for x in change.save]
    logged += [(key, "", "", 0.0, 0.0) for key in deleted]
    last = log_changes(txn, backend, instance, "lease", logged, at)
    return Written(kept=frozenset(kept), change_id=last)


def _delete_idle(
    txn: Transaction, backend: Backend, keys: Sequence[Key], before: float
) -> set[Key]:
    """Delete the leases of `keys` unused since `before`; the keys not deleted (used since,
    on another instance: not idle after all). All in one go when every one goes (the usual
    case, a sweep's batch); else again key by key, to tell which stayed."""
    sql = backend.sql(f"DELETE FROM leases WHERE {_KEY} AND last_used < ?")
    txn.execute("SAVEPOINT idle")
    txn.executemany(sql, [(*_key(key), before) for key in keys])
    if txn.rowcount == len(keys):
        txn.execute("RELEASE SAVEPOINT idle")
        return set()
    txn.execute("ROLLBACK TO SAVEPOINT idle")
    kept: set[Key] = set()
    for key in keys:
        txn.execute(sql, (*_key(key), before))
        if txn.rowcount != 1:
            kept.add(key)
    txn.execute("RELEASE SAVEPOINT idle")
    return kept


def _conditional(txn: Transaction, backend: Backend, lease: Lease, had: str) -> bool:
    """Write `lease` if the store still has the key on `had` ("" for no row at all)."""
    if not had:
        sql = (
            f"INSERT INTO leases ({_LEASE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (route, fp, model) DO NOTHING"
        )
        txn.execute(backend.sql(sql), _row(lease))
    else:
        sql = (
            f"UPDATE leases SET host = ?, state = ?, created = ?, "
            f"last_used = {backend.greatest}(last_used, ?) WHERE {_KEY} AND host = ?"
        )
        args = (lease.host, lease.state.value, lease.created, lease.last_used)
        txn.execute(backend.sql(sql), (*args, *_key(lease.key), had))
    return txn.rowcount == 1


def _current(txn: Transaction, backend: Backend, key: Key) -> Lease | None:
    txn.execute(backend.sql(f"SELECT {_LEASE_COLUMNS} FROM leases WHERE {_KEY}"), _key(key))
    row = txn.fetchone()
    if row is None:
        return None
    route, fp, model, host, state, created, last_used = row
    return Lease(Key(route, fp, model), host, _STATES[state], created, last_used)


def log_changes(
    txn: Transaction,
    backend: Backend,
    instance: str,
    kind: str,
    rows: Sequence[tuple[Key, str, str, float, float]],
    at: float,
) -> int:
    """Append change-log rows; the number of the last one (0 when there are none)."""
    if not rows:
        return 0
    txn.execute(backend.sql("UPDATE change_counter SET n = n + ? RETURNING n"), (len(rows),))
    (last,) = txn.fetchone()
    first = last - len(rows) + 1
    sql = (
        "INSERT INTO changes (id, instance, kind, route, fp, model, host, state, created, "
        "last_used, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    values = [
        (first + i, instance, kind, key.route, key.fp, key.model, host, state, created, used, at)
        for i, (key, host, state, created, used) in enumerate(rows)
    ]
    txn.executemany(backend.sql(sql), values)
    return last


def write_draining(
    txn: Transaction, backend: Backend, instance: str, name: str, draining: bool
) -> None:
    """Set a host's draining flag, and log it for the other instances."""
    if backend.begin_write:
        txn.execute(backend.begin_write)
    sql = (
        "INSERT INTO host_state (name, draining) VALUES (?, ?) "
        "ON CONFLICT (name) DO UPDATE SET draining = excluded.draining"
    )
    txn.execute(backend.sql(sql), (name, int(draining)))
    txn.execute(f"SELECT {backend.epoch_now}")
    (now,) = txn.fetchone()
    row = (Key(name, "", ""), name if draining else "", "draining" if draining else "", 0.0, 0.0)
    log_changes(txn, backend, instance, "drain", [row], now)


def read_changes(txn: Transaction, backend: Backend, after: int, limit: int) -> list[ChangeRow]:
    sql = (
        "SELECT id, instance, kind, route, fp, model, host, state, created, last_used "
        "FROM changes WHERE id > ? ORDER BY id LIMIT ?"
    )
    txn.execute(backend.sql(sql), (after, limit))
    return [ChangeRow(*row) for row in txn.fetchall()]
