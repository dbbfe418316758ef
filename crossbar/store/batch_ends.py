"""How a batch ends in the store (schema/008-batches.sql), each function one transaction in the
store's thread: a cancel, the completion window passing, the items an ending batch leaves unrun
written to its error file, the finalizing that writes its files and last status (taken over
when its finisher dies), and the pruning of ended batches.
"""

from __future__ import annotations

import json

from attrs import asdict
from twisted.enterprise.adbapi import Transaction

from crossbar.store.backends import SQLITE, Backend, begin
from crossbar.store.batches import (
    CANCELLED,
    CANCELLING,
    COMPLETED,
    DONE,
    ENDED,
    EXPIRED,
    FILE_COLUMNS,
    FINALIZING,
    IN_PROGRESS,
    ITEM_FAILED,
    PENDING,
    RUNNING,
    VALIDATING,
    Counts,
    ErrorLine,
    FileRow,
    count_items,
    file_values,
    write_event,
)


def cancel_batch(
    txn: Transaction, backend: Backend, instance: str, batch_id: str, now: float,
    lines: ErrorLine,
) -> str | None:  # fmt: skip
    """Cancel a batch: its items not yet run end in the error file (`lines` writes them), and
    it is `cancelling` until its running items end. Its status after, None for no batch."""
    begin(txn, backend)
    txn.execute(backend.sql("SELECT status FROM batches WHERE id = ?"), (batch_id,))
    row = txn.fetchone()
    if row is None:
        return None
    (status,) = row
    if status not in (VALIDATING, IN_PROGRESS):
        return str(status)
    ended = _end_pending(txn, backend, batch_id, CANCELLED, lines, now)
    write_event(txn, backend, now, batch_id, CANCELLING, instance, f"{ended} requests not run")
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
    begin(txn, backend)
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
        write_event(
            txn, backend, now, batch_id, "expiring", instance, "its completion window passed"
        )
    txn.execute(
        backend.sql("SELECT id, ending FROM batches WHERE status IN (?, ?) AND ending <> ''"),
        (IN_PROGRESS, CANCELLING),
    )
    for batch_id, ending in txn.fetchall():
        _end_pending(txn, backend, batch_id, ending, lines, now)
    return expired


def start_finalizing(
    txn: Transaction, backend: Backend, instance: str, now: float, until: float
) -> list[str]:
    """Take the batches whose items have all ended (or whose finisher's time ran out) to
    finalize: `finalizing`, this instance's until `until`."""
    begin(txn, backend)
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
        write_event(txn, backend, now, batch_id, FINALIZING, instance)
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
    begin(txn, backend)
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
            sql = f"INSERT INTO batch_files ({FILE_COLUMNS}, content) VALUES ({', '.join('?' * 9)})"
            txn.execute(backend.sql(sql), (*file_values(add), content))
            ids[name] = file.id
    status = ending or COMPLETED
    counts = count_items(txn, backend, [batch_id]).get(batch_id, Counts())  # kept: they are final
    column = f"{status}_at"
    detail = f"{len(done)} answered, {len(failed)} in the error file"
    write_event(txn, backend, now, batch_id, status, instance, detail)
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
    begin(txn, backend)
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
