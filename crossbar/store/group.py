"""Group commit: the store's writes (lease changes and usage rows) go to the database together.

One group is written at a time. A write that arrives while the store is idle starts a group
at once (no added latency when the store is quiet); writes that arrive while a group is being
written wait and go together in the next one, one transaction and one commit for all of them.
A burst of 1,000 new conversations so pays a few dozen commits instead of 2,000. Each write
keeps its own result (a conditional lease change that another instance beat is not applied,
and says so), and the order writes were submitted in is the order they are applied, so the
lease table's memory still replays the store's history. A group that fails fails every write
in it: none of them was written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from attrs import define
from twisted.enterprise.adbapi import Transaction
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.python.failure import Failure

from crossbar.leases import Change, Written
from crossbar.store.backends import Backend
from crossbar.store.writes import write_change

MAX_GROUP = 2_000  # writes in one transaction at most: a group stays short


@define
class Pending:
    """One write waiting for its group: a lease change, or usage rows (as column values)."""

    change: Change | None
    usage: list[tuple] | None
    durable: bool
    done: Deferred[Any]


Runner = Callable[[Sequence[tuple[Change | None, list[tuple] | None]], bool, str], Any]


class GroupCommit:
    """Queues writes and hands them to `run(items, durable, what)` a group at a time; `run`
    writes the items in one transaction and returns their results in order (an awaitable)."""

    def __init__(self, run: Runner, most: int = MAX_GROUP) -> None:
        self._run = run
        self._most = most
        self._queue: list[Pending] = []
        self._busy = False
        self.groups = 0  # transactions written
        self.writes = 0  # writes they held

    def lease(self, change: Change, durable: bool) -> Deferred[Written]:
        """Write a lease change in the next group; fires with what the store did."""
        return self._submit(Pending(change, None, durable, Deferred()))

    def usage(self, rows: list[tuple]) -> Deferred[None]:
        """Insert usage rows (column values) in the next group."""
        return self._submit(Pending(None, rows, False, Deferred()))

    def _submit(self, item: Pending) -> Deferred[Any]:
        self._queue.append(item)
        if not self._busy:
            self._next()
        return item.done

    def _next(self) -> None:
        if not self._queue:
            self._busy = False
            return
        self._busy = True
        group, self._queue = self._queue[: self._most], self._queue[self._most :]
        durable = any(item.durable for item in group)
        what = "saving leases" if any(i.change is not None for i in group) else "recording usage"
        self.groups += 1
        self.writes += len(group)
        d = ensureDeferred(self._run([(i.change, i.usage) for i in group], durable, what))

        def deliver(results: object) -> None:
            # Writes submitted by these callbacks join the queue for the next group.
            if isinstance(results, Failure):
                for item in group:
                    item.done.errback(results)
            else:
                assert isinstance(results, list)
                for item, result in zip(group, results, strict=True):
                    item.done.callback(result)
            self._next()

        d.addBoth(deliver)


def write_group(
    txn: Transaction,
    backend: Backend,
    instance: str,
    usage_sql: str,
    items: Sequence[tuple[Change | None, list[tuple] | None]],
) -> list[Written | None]:
    """In the store's thread: every item in one transaction, results in order; the group's
    usage rows, whoever submitted them, in one statement at its end (nothing reads them
    before it commits, and a lease change never depends on them)."""
    if backend.begin_write:
        txn.execute(backend.begin_write)
    results: list[Written | None] = []
    rows: list[tuple] = []
    for change, usage in items:
        if change is not None:
            results.append(write_change(txn, backend, instance, change, begin=False))
        else:
            rows += usage or ()
            results.append(None)
    if rows:
        txn.executemany(usage_sql, rows)
    return results
