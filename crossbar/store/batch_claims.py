"""The Batch API's items shared out by claims (schema/008-batches.sql), each function one
transaction in the store's thread.

`claim_items` marks up to n runnable items with this instance's token and a deadline, skipping
rows another instance's transaction holds (PostgreSQL's `FOR UPDATE SKIP LOCKED`; SQLite's
`BEGIN IMMEDIATE` lets one writer claim at a time). A claim is renewed while its instance lives;
one that runs out is claimable again, so an instance that dies gives its items back. An item's
result is written only under the claim that holds it (`end_items`), so each item ends once,
whoever ran it last.
"""

from __future__ import annotations

from collections.abc import Iterable

from attrs import frozen
from twisted.enterprise.adbapi import Transaction

from crossbar.store.backends import SQLITE, Backend, begin
from crossbar.store.batches import IN_PROGRESS, PENDING, RUNNING


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


def claim_items(
    txn: Transaction, backend: Backend, token: str, now: float, until: float, limit: int
) -> list[Claim]:
    """Up to `limit` runnable items of batches in progress, in batch order and, within a batch,
    by shared system prompt: running ones whose claim ran out first, then pending ones that are
    due. Now this instance's (`token`) until `until`."""
    begin(txn, backend)
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
    begin(txn, backend)
    txn.execute(
        backend.sql("UPDATE batch_items SET not_before = ? WHERE claim = ? AND state = ?"),
        (until, token, RUNNING),
    )
    return int(txn.rowcount)


def end_items(txn: Transaction, backend: Backend, token: str, ended: Iterable[Ended]) -> list[bool]:
    """Write each item's result, where this instance's claim still holds it: True for each
    written, False for one whose claim ran out and went to another instance."""
    begin(txn, backend)
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
    begin(txn, backend)
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
    begin(txn, backend)
    txn.execute(
        backend.sql(
            "UPDATE batch_items SET state = ?, claim = '', not_before = 0 "
            "WHERE claim = ? AND state = ?"
        ),
        (PENDING, token, RUNNING),
    )
    return int(txn.rowcount)
