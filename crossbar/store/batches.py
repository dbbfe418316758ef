"""The Batch API's files and batches in the store (schema/008-batches.sql): their rows, statuses
and events, created and read, each function one transaction in the store's thread. Their items'
claims are batch_claims.py's; how a batch ends (cancelled, expired, finalized, pruned) is
batch_ends.py's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from attrs import frozen
from twisted.enterprise.adbapi import Transaction

from crossbar.store.backends import Backend, begin

# Batch statuses (OpenAI's).
VALIDATING, FAILED, IN_PROGRESS, FINALIZING = "validating", "failed", "in_progress", "finalizing"
COMPLETED, EXPIRED, CANCELLING, CANCELLED = "completed", "expired", "cancelling", "cancelled"
ENDED = BATCH_ENDED = (FAILED, COMPLETED, EXPIRED, CANCELLED)
BATCH_STATUSES = (VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING, *ENDED)
# Item states.
PENDING, RUNNING, DONE, ITEM_FAILED = "pending", "running", "done", "failed"

# The error line of an item that will not run, by its custom_id and why: its batch's ending
# (`cancelled` or `expired`).
ErrorLine = Callable[[str, str], str]

FILE_COLUMNS = "id, route, key, purpose, filename, bytes, lines, created"
_BATCH_COLUMNS = (
    "id, route, key, endpoint, input_file_id, completion_window, status, created, expires_at, "
    "in_progress_at, finalizing_at, completed_at, failed_at, expired_at, cancelling_at, "
    "cancelled_at, output_file_id, error_file_id, errors, metadata, total"
)
_READ_COLUMNS = _BATCH_COLUMNS + ", counts"  # and what an ended batch keeps of its items


@frozen
class FileRow:
    """A stored file, without its content."""

    id: str
    route: str
    key: str
    purpose: str
    filename: str
    bytes: int
    lines: int
    created: float


@frozen
class Counts:
    """A batch's items by state, and the tokens of those that ran."""

    pending: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


@frozen
class BatchRow:
    """A batch as stored, with its items' counts."""

    id: str
    route: str
    key: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created: float
    expires_at: float
    in_progress_at: float
    finalizing_at: float
    completed_at: float
    failed_at: float
    expired_at: float
    cancelling_at: float
    cancelled_at: float
    output_file_id: str
    error_file_id: str
    errors: str
    metadata: str
    total: int
    counts: Counts = Counts()


@frozen
class NewItem:
    """One request line of a batch being created."""

    line: int
    custom_id: str
    group: str
    body: str


@frozen
class BatchEvent:
    """A change of a batch's status, as `batch_events` keeps it."""

    at: float
    batch: str
    status: str
    instance: str
    detail: str


def write_event(
    txn: Transaction, backend: Backend, at: float, batch: str, status: str, instance: str,
    detail: str = "",
) -> None:  # fmt: skip
    txn.execute(
        backend.sql(
            "INSERT INTO batch_events (at, batch, status, instance, detail) VALUES (?, ?, ?, ?, ?)"
        ),
        (at, batch, status, instance, detail),
    )


def list_events(
    txn: Transaction, backend: Backend, batch: str | None, limit: int
) -> list[BatchEvent]:
    """The latest batch events (one batch's, or all), newest first."""
    where, args = ("WHERE batch = ? ", (batch,)) if batch else ("", ())
    txn.execute(
        backend.sql(
            f"SELECT at, batch, status, instance, detail FROM batch_events {where}"
            "ORDER BY id DESC LIMIT ?"
        ),
        (*args, limit),
    )
    return [BatchEvent(float(at), b, st, i, d) for at, b, st, i, d in txn.fetchall()]


# -- files ----------------------------------------------------------------------------------


def add_file(txn: Transaction, backend: Backend, row: FileRow, content: str) -> None:
    begin(txn, backend)
    sql = f"INSERT INTO batch_files ({FILE_COLUMNS}, content) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    txn.execute(backend.sql(sql), (*file_values(row), content))


def file_values(row: FileRow) -> tuple:
    return (
        row.id,
        row.route,
        row.key,
        row.purpose,
        row.filename,
        row.bytes,
        row.lines,
        row.created,
    )


def _file(row: Sequence) -> FileRow:
    id_, route, key, purpose, filename, size, lines, created = row
    return FileRow(id_, route, key, purpose, filename, int(size), int(lines), float(created))


def read_file(txn: Transaction, backend: Backend, file_id: str) -> FileRow | None:
    txn.execute(backend.sql(f"SELECT {FILE_COLUMNS} FROM batch_files WHERE id = ?"), (file_id,))
    row = txn.fetchone()
    return None if row is None else _file(row)


def file_content(txn: Transaction, backend: Backend, file_id: str) -> str | None:
    txn.execute(backend.sql("SELECT content FROM batch_files WHERE id = ?"), (file_id,))
    row = txn.fetchone()
    return None if row is None else row[0]


def list_files(
    txn: Transaction, backend: Backend, route: str, key: str, purpose: str, after: str, limit: int
) -> list[FileRow]:
    """A route and key's files, newest first, after the file `after` (its id) when given."""
    where, args = ["route = ?", "key = ?"], [route, key]
    if purpose:
        where.append("purpose = ?")
        args.append(purpose)
    if after:
        where.append("(created, id) < (SELECT created, id FROM batch_files WHERE id = ?)")
        args.append(after)
    sql = (
        f"SELECT {FILE_COLUMNS} FROM batch_files WHERE {' AND '.join(where)} "
        "ORDER BY created DESC, id DESC LIMIT ?"
    )
    txn.execute(backend.sql(sql), (*args, limit))
    return [_file(row) for row in txn.fetchall()]


def delete_file(txn: Transaction, backend: Backend, file_id: str) -> bool:
    begin(txn, backend)
    txn.execute(backend.sql("DELETE FROM batch_files WHERE id = ?"), (file_id,))
    return txn.rowcount > 0


# -- batches --------------------------------------------------------------------------------


def create_batch(
    txn: Transaction, backend: Backend, instance: str, row: BatchRow, items: Sequence[NewItem]
) -> None:
    """The batch and all its items, in one transaction."""
    begin(txn, backend)
    detail = f"{row.total} requests to {row.endpoint}" if row.status != FAILED else row.errors
    write_event(txn, backend, row.created, row.id, row.status, instance, detail)
    marks = ", ".join("?" * 21)
    txn.execute(
        backend.sql(f"INSERT INTO batches ({_BATCH_COLUMNS}) VALUES ({marks})"),
        _batch_values(row),
    )
    txn.executemany(
        backend.sql(
            "INSERT INTO batch_items (batch, line, custom_id, grp, body, state) "
            "VALUES (?, ?, ?, ?, ?, ?)"
        ),
        [(row.id, i.line, i.custom_id, i.group, i.body, PENDING) for i in items],
    )


def _batch_values(row: BatchRow) -> tuple:
    return (
        row.id, row.route, row.key, row.endpoint, row.input_file_id, row.completion_window,
        row.status, row.created, row.expires_at, row.in_progress_at, row.finalizing_at,
        row.completed_at, row.failed_at, row.expired_at, row.cancelling_at, row.cancelled_at,
        row.output_file_id, row.error_file_id, row.errors, row.metadata, row.total,
    )  # fmt: skip


def _batch(row: Sequence, counts: Counts) -> BatchRow:
    id_, route, key, endpoint, input_file, window, status = row[:7]
    times = row[7:16]
    output, error, errors, metadata, total = row[16:21]
    return BatchRow(
        id_, route, key, endpoint, input_file, window, status,
        *(float(t) for t in times),
        output, error, errors, metadata, int(total), counts,
    )  # fmt: skip


def count_items(txn: Transaction, backend: Backend, ids: Sequence[str]) -> dict[str, Counts]:
    if not ids:
        return {}
    marks = ", ".join("?" * len(ids))
    txn.execute(
        backend.sql(
            "SELECT batch, state, COUNT(*), SUM(prompt_tokens), SUM(cached_tokens), "
            f"SUM(completion_tokens) FROM batch_items WHERE batch IN ({marks}) "
            "GROUP BY batch, state"
        ),
        tuple(ids),
    )
    found: dict[str, dict[str, int]] = {}
    for batch, state, n, prompt, cached, completion in txn.fetchall():
        into = found.setdefault(batch, {})
        into[state] = int(n)
        for name, value in (("p", prompt), ("c", cached), ("o", completion)):
            into[name] = into.get(name, 0) + int(value or 0)
    return {
        batch: Counts(
            c.get(PENDING, 0),
            c.get(RUNNING, 0),
            c.get(DONE, 0),
            c.get(ITEM_FAILED, 0),
            c.get("p", 0),
            c.get("c", 0),
            c.get("o", 0),
        )
        for batch, c in found.items()
    }


def _rows(txn: Transaction, backend: Backend, rows: Sequence[Sequence]) -> list[BatchRow]:
    """Batches read with `_READ_COLUMNS`, each with its counts: those an ended batch keeps,
    else its items counted now."""
    kept = {row[0]: Counts(**json.loads(row[-1])) for row in rows if row[-1]}
    counted = count_items(txn, backend, [row[0] for row in rows if row[0] not in kept])
    return [_batch(row, kept.get(row[0]) or counted.get(row[0], Counts())) for row in rows]


def read_batch(txn: Transaction, backend: Backend, batch_id: str) -> BatchRow | None:
    txn.execute(backend.sql(f"SELECT {_READ_COLUMNS} FROM batches WHERE id = ?"), (batch_id,))
    row = txn.fetchone()
    return None if row is None else _rows(txn, backend, [row])[0]


def list_batches(
    txn: Transaction, backend: Backend, route: str | None, key: str | None, after: str, limit: int,
    status: str | None = None,
) -> list[BatchRow]:  # fmt: skip
    """Batches newest first (a route and key's, or every one's for None; of one `status`, or
    any), after `after`'s."""
    where: list[str] = []
    args: list[object] = []
    for column, value in (("route", route), ("key", key), ("status", status)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    if after:
        where.append("(created, id) < (SELECT created, id FROM batches WHERE id = ?)")
        args.append(after)
    clause = f"WHERE {' AND '.join(where)} " if where else ""
    sql = f"SELECT {_READ_COLUMNS} FROM batches {clause}ORDER BY created DESC, id DESC LIMIT ?"
    txn.execute(backend.sql(sql), (*args, limit))
    return _rows(txn, backend, txn.fetchall())


def batch_report(
    txn: Transaction, backend: Backend, batch_id: str, limit: int
) -> tuple[BatchRow | None, list[BatchEvent]]:
    """A batch with its counts and its latest `limit` events, newest first, in one read."""
    row = read_batch(txn, backend, batch_id)
    return row, (list_events(txn, backend, batch_id, limit) if row is not None else [])


@frozen
class BatchTally:
    """The store's batches by status (every status, 0 for none), and the items of the batches
    that have not ended by state (pending, running, done, failed)."""

    batches: dict[str, int]
    items: dict[str, int]


def tally(txn: Transaction, backend: Backend) -> BatchTally:
    """How many batches the store holds in each status, and the items of those not ended in
    each state: two grouped counts, what /metrics shows of every instance's batches."""
    txn.execute(backend.sql("SELECT status, COUNT(*) FROM batches GROUP BY status"))
    batches = dict.fromkeys(BATCH_STATUSES, 0)
    for status, n in txn.fetchall():
        batches[str(status)] = int(n)
    marks = ", ".join("?" * len(ENDED))
    txn.execute(
        backend.sql(
            "SELECT i.state, COUNT(*) FROM batch_items i JOIN batches b ON b.id = i.batch "
            f"WHERE b.status NOT IN ({marks}) GROUP BY i.state"
        ),
        ENDED,
    )
    items = dict.fromkeys((PENDING, RUNNING, DONE, ITEM_FAILED), 0)
    for state, n in txn.fetchall():
        items[str(state)] = int(n)
    return BatchTally(batches, items)


def any_running(txn: Transaction, backend: Backend) -> bool:
    """Whether some batch has not ended: the runner's timer does nothing else while none has."""
    txn.execute(
        backend.sql("SELECT 1 FROM batches WHERE status IN (?, ?, ?) LIMIT 1"),
        (IN_PROGRESS, CANCELLING, FINALIZING),
    )
    return txn.fetchone() is not None
