"""The store's client keys and what each instance charged them (run in the store's thread, each
function one transaction). See schema/005-client-keys.sql.

Every write of `client_keys` is also a row of the change log (kind 'key', route = the key's
name), so the other instances read the key again within the follower's delay: a block made on
one instance refuses the key on every instance within a second.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from twisted.enterprise.adbapi import Transaction

from crossbar.config import KeyLimits
from crossbar.leases import Key
from crossbar.store.backends import Backend
from crossbar.store.writes import log_changes
from crossbar.tenants import CONFIG, ClientKey

_COLUMNS = (
    "name, sha256, old_sha256, old_until, routes, models, expires, blocked, limits, created, "
    "source, seed"
)
_SPEND_KEEP = 40 * 86400.0  # a month's spending is read for its month; older rows go


def _values(key: ClientKey) -> tuple:
    return (
        key.name, key.sha256, key.old_sha256, key.old_until, json.dumps(list(key.routes)),
        json.dumps(list(key.models)), key.expires, int(key.blocked),
        json.dumps(key.limits.to_json(), sort_keys=True), key.created, key.source, key.seed,
    )  # fmt: skip


def _key(row: Sequence) -> ClientKey:
    name, sha, old, old_until, routes, models, expires, blocked, limits, created, source, seed = row
    return ClientKey(
        name=name,
        sha256=sha,
        routes=tuple(json.loads(routes)),
        models=tuple(json.loads(models)),
        expires=None if expires is None else float(expires),
        blocked=bool(blocked),
        limits=KeyLimits.from_json(json.loads(limits)),
        created=float(created),
        source=source,
        seed=seed,
        old_sha256=old,
        old_until=float(old_until),
    )


def read_keys(txn: Transaction, backend: Backend, names: Iterable[str] | None = None) -> list:
    """Every key (or those of `names` that exist), by name."""
    if names is None:
        txn.execute(f"SELECT {_COLUMNS} FROM client_keys ORDER BY name")
        return [_key(row) for row in txn.fetchall()]
    wanted = sorted(set(names))
    if not wanted:
        return []
    marks = ", ".join("?" * len(wanted))
    txn.execute(
        backend.sql(f"SELECT {_COLUMNS} FROM client_keys WHERE name IN ({marks}) ORDER BY name"),
        tuple(wanted),
    )
    return [_key(row) for row in txn.fetchall()]


def _now(txn: Transaction, backend: Backend) -> float:
    txn.execute(f"SELECT {backend.epoch_now}")
    (now,) = txn.fetchone()
    return float(now)


def _logged(txn: Transaction, backend: Backend, instance: str, names: Iterable[str]) -> None:
    rows = [(Key(name, "", ""), "", "", 0.0, 0.0) for name in names]
    if rows:
        log_changes(txn, backend, instance, "key", rows, _now(txn, backend))


def _upsert(txn: Transaction, backend: Backend, keys: Sequence[ClientKey]) -> None:
    updates = ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS.split(", ")[1:])
    sql = (
        f"INSERT INTO client_keys ({_COLUMNS}) VALUES ({', '.join('?' * 12)}) "
        f"ON CONFLICT (name) DO UPDATE SET {updates}"
    )
    txn.executemany(backend.sql(sql), [_values(k) for k in keys])


def create_key(txn: Transaction, backend: Backend, instance: str, key: ClientKey) -> bool:
    """Insert a new key; False (nothing written) when one of that name exists."""
    if backend.begin_write:
        txn.execute(backend.begin_write)
    sql = (
        f"INSERT INTO client_keys ({_COLUMNS}) VALUES ({', '.join('?' * 12)}) "
        "ON CONFLICT (name) DO NOTHING"
    )
    txn.execute(backend.sql(sql), _values(key))
    if txn.rowcount != 1:
        return False
    _logged(txn, backend, instance, [key.name])
    return True


def save_key(txn: Transaction, backend: Backend, instance: str, key: ClientKey) -> None:
    """Write a key as it is now (blocked, rotated...)."""
    if backend.begin_write:
        txn.execute(backend.begin_write)
    _upsert(txn, backend, [key])
    _logged(txn, backend, instance, [key.name])


def delete_key(txn: Transaction, backend: Backend, instance: str, name: str) -> bool:
    """Delete a key; False when there was none."""
    if backend.begin_write:
        txn.execute(backend.begin_write)
    txn.execute(backend.sql("DELETE FROM client_keys WHERE name = ?"), (name,))
    if txn.rowcount != 1:
        return False
    _logged(txn, backend, instance, [name])
    return True


def seed_keys(
    txn: Transaction, backend: Backend, instance: str, seeds: Sequence[ClientKey]
) -> list[ClientKey]:
    """Make the store's config keys the config's: a key whose config entry changed (its seed
    digest differs) or is new is written as the config says; one whose entry is unchanged
    keeps what the admin API did to it since (a block, a rotation); a config key the config
    no longer has is deleted. Keys made through the admin API are left alone. Every key after."""
    if backend.begin_write:
        txn.execute(backend.begin_write)
    current = {k.name: k for k in read_keys(txn, backend)}
    wanted = {k.name: k for k in seeds}
    # The config wins over a key of the same name made through the admin API (seed "").
    changed = [k for k in seeds if current.get(k.name) is None or current[k.name].seed != k.seed]
    gone = [n for n, k in current.items() if k.source == CONFIG and n not in wanted]
    if changed:
        _upsert(txn, backend, changed)
    if gone:
        txn.executemany(backend.sql("DELETE FROM client_keys WHERE name = ?"), [(n,) for n in gone])
    _logged(txn, backend, instance, [k.name for k in changed] + gone)
    return read_keys(txn, backend)


def sync_spend(
    txn: Transaction,
    backend: Backend,
    instance: str,
    rows: Sequence[tuple[str, str, float, float]],
    periods: Sequence[str],
) -> dict[tuple[str, str], float]:
    """Write this instance's spending (key, period, spent, period start) and read the others'
    per (key, period) for `periods`; spending of periods long over is pruned."""
    if backend.begin_write:
        txn.execute(backend.begin_write)
    if rows:
        sql = (
            "INSERT INTO key_spend (key, period, instance, spent, starts) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (key, period, instance) DO UPDATE SET spent = excluded.spent"
        )
        txn.executemany(
            backend.sql(sql), [(k, p, instance, spent, starts) for k, p, spent, starts in rows]
        )
    now = _now(txn, backend)
    txn.execute(backend.sql("DELETE FROM key_spend WHERE starts < ?"), (now - _SPEND_KEEP,))
    if not periods:
        return {}
    marks = ", ".join("?" * len(periods))
    txn.execute(
        backend.sql(
            f"SELECT key, period, SUM(spent) FROM key_spend WHERE period IN ({marks}) "
            "AND instance <> ? GROUP BY key, period"
        ),
        (*periods, instance),
    )
    return {(k, p): float(s) for k, p, s in txn.fetchall()}
