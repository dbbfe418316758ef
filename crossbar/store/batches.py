"""The Batch API's files, batches and items in the store (schema/008-batches.sql), each function
one transaction in the store's thread.

Items are shared out by claims: `claim_items` marks up to n runnable items with this instance's
token and a deadline, skipping rows another instance's transaction holds (PostgreSQL's
`FOR UPDATE SKIP LOCKED`; SQLite's `BEGIN IMMEDIATE` lets one writer claim at a time). A claim
is renewed while its instance lives; one that runs out is claimable again, so an instance that
dies gives its items back. An item's result is written only by the claim that holds it
(`settle_item`), so each item ends once, whoever ran it last.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence

from attrs import asdict, frozen
from twisted.enterprise.adbapi import Transaction

from crossbar.store.backends import SQLITE, Backend

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

_FILE_COLUMNS = "id, route, key, purpose, filename, bytes, lines, created"
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
class Claim:
    """An item this instance claimed, with what running it needs."""

    batch: str
    line: int
    custom_id: str
    body: str
    attempts: int
    route: str
    key: str
    endpoint: str


@frozen
class Ended:
    """What an ending item writes: its state (done or failed), its line and its tokens."""

    batch: str
    line: int
    state: str
    result: str
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


def _begin(txn: Transaction, backend: Backend) -> None:
    if backend.begin_write:
        txn.execute(backend.begin_write)


@frozen
class BatchEvent:
    """A change of a batch's status, as `batch_events` keeps it."""

    at: float
    batch: str
    status: str
    instance: str
    detail: str


def _event(
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
    _begin(txn, backend)
    sql = f"INSERT INTO batch_files ({_FILE_COLUMNS}, content) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    txn.execute(backend.sql(sql), (*_file_values(row), content))


def _file_values(row: FileRow) -> tuple:
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
    txn.execute(backend.sql(f"SELECT {_FILE_COLUMNS} FROM batch_files WHERE id = ?"), (file_id,))
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
        f"SELECT {_FILE_COLUMNS} FROM batch_files WHERE {' AND '.join(where)} "
        "ORDER BY created DESC, id DESC LIMIT ?"
    )
    txn.execute(backend.sql(sql), (*args, limit))
    return [_file(row) for row in txn.fetchall()]


def delete_file(txn: Transaction, backend: Backend, file_id: str) -> bool:
    _begin(txn, backend)
    txn.execute(backend.sql("DELETE FROM batch_files WHERE id = ?"), (file_id,))
    return txn.rowcount > 0


# -- batches --------------------------------------------------------------------------------


def create_batch(
    txn: Transaction, backend: Backend, instance: str, row: BatchRow, items: Sequence[NewItem]
) -> None:
    """The batch and all its items, in one transaction."""
    _begin(txn, backend)
    detail = f"{row.total} requests to {row.endpoint}" if row.status != FAILED else row.errors
    _event(txn, backend, row.created, row.id, row.status, instance, detail)
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


def _counts(txn: Transaction, backend: Backend, ids: Sequence[str]) -> dict[str, Counts]:
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
    counted = _counts(txn, backend, [row[0] for row in rows if row[0] not in kept])
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


def cancel_batch(
    txn: Transaction, backend: Backend, instance: str, batch_id: str, now: float,
    lines: ErrorLine,
) -> str | None:  # fmt: skip
    """Cancel a batch: its items not yet run end in the error file (`lines` writes them), and
    it is `cancelling` until its running items end. Its status after, None for no batch."""
    _begin(txn, backend)
    txn.execute(backend.sql("SELECT status FROM batches WHERE id = ?"), (batch_id,))
    row = txn.fetchone()
    if row is None:
        return None
    (status,) = row
    if status not in (VALIDATING, IN_PROGRESS):
        return str(status)
    ended = _end_pending(txn, backend, batch_id, CANCELLED, lines, now)
    _event(txn, backend, now, batch_id, CANCELLING, instance, f"{ended} requests not run")
    txn.execute(
        backend.sql("UPDATE batches SET status = ?, cancelling_at = ?, ending = ? WHERE id = ?"),
        (CANCELLING, now, CANCELLED, batch_id),
    )
    return CANCELLING


def _end_pending(
    txn: Transaction, backend: Backend, batch_id: str, ending: str, lines: ErrorLine, now: float
) -> int:
    """End the items of an ending batch that will not run: pending ones, and running ones whose
    claim ran out (their instance died)."""
    txn.execute(
        backend.sql(
            "SELECT line, custom_id FROM batch_items WHERE batch = ? "
            "AND (state = ? OR (state = ? AND not_before < ?))"
        ),
        (batch_id, PENDING, RUNNING, now),
    )
    ended = [
        (ITEM_FAILED, lines(custom_id, ending), batch_id, line)
        for line, custom_id in txn.fetchall()
    ]
    txn.executemany(
        backend.sql(
            "UPDATE batch_items SET state = ?, result = ?, claim = '' WHERE batch = ? AND line = ?"
        ),
        ended,
    )
    return len(ended)


def close_ending(
    txn: Transaction, backend: Backend, instance: str, now: float, lines: ErrorLine
) -> list[str]:
    """Batches past their completion window end as `expired`; the items of every ending batch
    (expired or cancelled) that will not run go to its error file. The ids that expired now."""
    _begin(txn, backend)
    txn.execute(
        backend.sql("SELECT id FROM batches WHERE status = ? AND ending = '' AND expires_at <= ?"),
        (IN_PROGRESS, now),
    )
    expired = [batch_id for (batch_id,) in txn.fetchall()]
    txn.executemany(
        backend.sql("UPDATE batches SET ending = ?, expired_at = ? WHERE id = ?"),
        [(EXPIRED, now, batch_id) for batch_id in expired],
    )
    for batch_id in expired:
        _event(txn, backend, now, batch_id, "expiring", instance, "its completion window passed")
    txn.execute(
        backend.sql("SELECT id, ending FROM batches WHERE status IN (?, ?) AND ending <> ''"),
        (IN_PROGRESS, CANCELLING),
    )
    for batch_id, ending in txn.fetchall():
        _end_pending(txn, backend, batch_id, ending, lines, now)
    return expired


def any_running(txn: Transaction, backend: Backend) -> bool:
    """Whether some batch has not ended: the runner's timer does nothing else while none has."""
    txn.execute(
        backend.sql("SELECT 1 FROM batches WHERE status IN (?, ?, ?) LIMIT 1"),
        (IN_PROGRESS, CANCELLING, FINALIZING),
    )
    return txn.fetchone() is not None


# -- items ----------------------------------------------------------------------------------


def claim_items(
    txn: Transaction, backend: Backend, token: str, now: float, until: float, limit: int
) -> list[Claim]:
    """Up to `limit` runnable items of batches in progress, in batch order and, within a batch,
    by shared system prompt: running ones whose claim ran out first, then pending ones that are
    due. Now this instance's (`token`) until `until`."""
    _begin(txn, backend)
    txn.execute(
        backend.sql(
            "SELECT id, route, key, endpoint FROM batches WHERE status = ? AND ending = '' "
            "ORDER BY created, id"
        ),
        (IN_PROGRESS,),
    )
    running = txn.fetchall()
    lock = "" if backend is SQLITE else " FOR UPDATE SKIP LOCKED"
    # One batch and one state at a time: the index (batch, state, grp, line) then gives the
    # order, and the read stops at the limit instead of sorting every item of the batch.
    sql = backend.sql(
        "SELECT line, custom_id, body, attempts FROM batch_items "
        f"WHERE batch = ? AND state = ? AND not_before <= ? ORDER BY grp, line LIMIT ?{lock}"
    )
    claims: list[Claim] = []
    for batch, route, key, endpoint in running:
        for state, due in ((RUNNING, now - 1e-6), (PENDING, now)):
            if len(claims) >= limit:
                break
            txn.execute(sql, (batch, state, due, limit - len(claims)))
            claims += [
                Claim(batch, line, custom_id, body, attempts, route, key, endpoint)
                for line, custom_id, body, attempts in txn.fetchall()
            ]
    txn.executemany(
        backend.sql(
            "UPDATE batch_items SET state = ?, claim = ?, not_before = ? "
            "WHERE batch = ? AND line = ?"
        ),
        [(RUNNING, token, until, c.batch, c.line) for c in claims],
    )
    return claims


def renew_claims(txn: Transaction, backend: Backend, token: str, until: float) -> int:
    """Keep this instance's running claims until `until`; how many it holds."""
    _begin(txn, backend)
    txn.execute(
        backend.sql("UPDATE batch_items SET not_before = ? WHERE claim = ? AND state = ?"),
        (until, token, RUNNING),
    )
    return int(txn.rowcount)


def end_items(txn: Transaction, backend: Backend, token: str, ended: Iterable[Ended]) -> list[bool]:
    """Write each item's result, where this instance's claim still holds it: True for each
    written, False for one whose claim ran out and went to another instance."""
    _begin(txn, backend)
    sql = backend.sql(
        "UPDATE batch_items SET state = ?, result = ?, claim = '', prompt_tokens = ?, "
        "cached_tokens = ?, completion_tokens = ? "
        "WHERE batch = ? AND line = ? AND claim = ? AND state = ?"
    )
    written = []
    for e in ended:
        args = (
            e.state, e.result, e.prompt_tokens, e.cached_tokens, e.completion_tokens,
            e.batch, e.line, token, RUNNING,
        )  # fmt: skip
        txn.execute(sql, args)
        written.append(txn.rowcount > 0)
    return written


def retry_item(
    txn: Transaction, backend: Backend, token: str, batch: str, line: int, when: float, count: bool
) -> bool:
    """Give a claimed item back to run again from `when`; `count`: it used an attempt."""
    _begin(txn, backend)
    txn.execute(
        backend.sql(
            "UPDATE batch_items SET state = ?, claim = '', not_before = ?, "
            "attempts = attempts + ? WHERE batch = ? AND line = ? AND claim = ? AND state = ?"
        ),
        (PENDING, when, int(count), batch, line, token, RUNNING),
    )
    return txn.rowcount > 0


def release_claims(txn: Transaction, backend: Backend, token: str) -> int:
    """A clean stop: this instance's claims go back to pending, for another to run now."""
    _begin(txn, backend)
    txn.execute(
        backend.sql(
            "UPDATE batch_items SET state = ?, claim = '', not_before = 0 "
            "WHERE claim = ? AND state = ?"
        ),
        (PENDING, token, RUNNING),
    )
    return int(txn.rowcount)


# -- the end of a batch ---------------------------------------------------------------------


def start_finalizing(
    txn: Transaction, backend: Backend, instance: str, now: float, until: float
) -> list[str]:
    """Take the batches whose items have all ended (or whose finisher's time ran out) to
    finalize: `finalizing`, this instance's until `until`."""
    _begin(txn, backend)
    txn.execute(
        backend.sql(
            "SELECT b.id FROM batches b WHERE ((b.status IN (?, ?) AND NOT EXISTS ("
            "SELECT 1 FROM batch_items i WHERE i.batch = b.id AND i.state IN (?, ?))) "
            "OR (b.status = ? AND b.finish_until < ?)) ORDER BY b.created LIMIT 8"
            + ("" if backend is SQLITE else " FOR UPDATE SKIP LOCKED")
        ),
        (IN_PROGRESS, CANCELLING, PENDING, RUNNING, FINALIZING, now),
    )
    ids = [batch_id for (batch_id,) in txn.fetchall()]
    for batch_id in ids:
        _event(txn, backend, now, batch_id, FINALIZING, instance)
        txn.execute(
            backend.sql(
                "UPDATE batches SET status = ?, finisher = ?, finish_until = ?, "
                "finalizing_at = CASE WHEN finalizing_at = 0 THEN ? ELSE finalizing_at END "
                "WHERE id = ?"
            ),
            (FINALIZING, instance, until, now, batch_id),
        )
    return ids


def finish_batch(
    txn: Transaction, backend: Backend, instance: str, batch_id: str, now: float,
    output: FileRow, error: FileRow,
) -> str | None:  # fmt: skip
    """Write a finalizing batch's output and error files (each only if it has lines) and its
    last status: `cancelled` if it was cancelled, `expired` if its window passed, else
    `completed`. None when another instance finalizes it now."""
    _begin(txn, backend)
    txn.execute(
        backend.sql("SELECT ending FROM batches WHERE id = ? AND status = ? AND finisher = ?"),
        (batch_id, FINALIZING, instance),
    )
    row = txn.fetchone()
    if row is None:
        return None
    (ending,) = row
    txn.execute(
        backend.sql("SELECT state, result FROM batch_items WHERE batch = ? ORDER BY line"),
        (batch_id,),
    )
    done: list[str] = []
    failed: list[str] = []
    for state, result in txn.fetchall():
        (done if state == DONE else failed).append(result)
    ids = {"output": "", "error": ""}
    for name, lines, file in (("output", done, output), ("error", failed, error)):
        if lines:
            content = "".join(line + "\n" for line in lines)
            size = len(content.encode("utf-8"))
            add = FileRow(file.id, file.route, file.key, file.purpose, file.filename, size,
                          len(lines), now)  # fmt: skip
            sql = (
                f"INSERT INTO batch_files ({_FILE_COLUMNS}, content) VALUES ({', '.join('?' * 9)})"
            )
            txn.execute(backend.sql(sql), (*_file_values(add), content))
            ids[name] = file.id
    status = ending or COMPLETED
    counts = _counts(txn, backend, [batch_id]).get(batch_id, Counts())  # kept: they are final
    column = f"{status}_at"
    detail = f"{len(done)} answered, {len(failed)} in the error file"
    _event(txn, backend, now, batch_id, status, instance, detail)
    txn.execute(
        backend.sql(
            f"UPDATE batches SET status = ?, {column} = CASE WHEN {column} = 0 THEN ? "
            f"ELSE {column} END, output_file_id = ?, error_file_id = ?, finisher = '', "
            "counts = ? WHERE id = ?"
        ),
        (status, now, ids["output"], ids["error"], json.dumps(asdict(counts)), batch_id),
    )
    return status


def prune_batches(txn: Transaction, backend: Backend, before: float) -> int:
    """Delete ended batches (their items and files) and files created before `before`."""
    _begin(txn, backend)
    marks = ", ".join("?" * len(ENDED))
    txn.execute(
        backend.sql(f"SELECT id FROM batches WHERE status IN ({marks}) AND created < ?"),
        (*ENDED, before),
    )
    ids = [(batch_id,) for (batch_id,) in txn.fetchall()]
    txn.executemany(backend.sql("DELETE FROM batch_items WHERE batch = ?"), ids)
    txn.executemany(backend.sql("DELETE FROM batches WHERE id = ?"), ids)
    txn.execute(backend.sql("DELETE FROM batch_events WHERE at < ?"), (before,))
    txn.execute(
        backend.sql(
            "DELETE FROM batch_files WHERE created < ? AND id NOT IN ("
            f"SELECT input_file_id FROM batches WHERE status NOT IN ({marks}))"
        ),
        (before, *ENDED),
    )
    return len(ids)


def metadata_json(text: str) -> dict[str, str] | None:
    """A batch's stored metadata as its object shows it."""
    return json.loads(text) if text else None
