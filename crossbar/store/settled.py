"""Report rows over usage that has settled, kept between a dashboard's refreshes.

A usage report reads the per-hour and per-minute sums and the raw rows before `rolled_until`
(see reports.py), and the raw rows after it. Everything before `rolled_until` is
settled: minutes are summed only once their rows have all arrived, and nothing writes them
again. So the rows a query over such a range returns are kept, keyed by the query and its
bounds, and a refresh every 3 s re-reads only the last few minutes of raw rows (and a minute's
sums once a minute, as the window's start moves). A roll-up changes no settled range (it adds
sums after the old `rolled_until`, deletes only raw rows already summed, and the queries name
their bounds, which move with it); a prune that deletes usage empties the cache. So does
another instance's prune, seen at the next report: a prune deletes the oldest sums first, so
the oldest minute or hour summed changes (`floor`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from twisted.enterprise.adbapi import Transaction

Rows = list[tuple[Any, ...]]


class SettledRows:
    """Rows of queries over settled ranges, the least recently used dropped beyond `size`
    queries or `max_rows` rows in all (a chart of every route by the minute is tens of
    thousands of rows; its window moves each minute). Read and filled from the store's
    threads, hence the lock."""

    def __init__(self, size: int = 128, max_rows: int = 200_000) -> None:
        self.size = size
        self.max_rows = max_rows
        self.hits = self.misses = 0
        self._rows: OrderedDict[tuple[str, tuple[Any, ...]], Rows] = OrderedDict()
        self._held = 0  # rows in all
        self._lock = threading.Lock()
        self._generation = 0  # a clear() while a query runs: its rows are not kept
        self._floor: tuple[Any, ...] | None = None  # the oldest minute and hour summed

    def fetch(self, txn: Transaction, sql: str, args: tuple[Any, ...]) -> Rows:
        """The rows of `sql` with `args`, run now unless kept from before."""
        key = (sql, args)
        with self._lock:
            rows = self._rows.get(key)
            if rows is not None:
                self._rows.move_to_end(key)
                self.hits += 1
                return rows
            generation = self._generation
        txn.execute(sql, args)
        rows = list(txn.fetchall())
        with self._lock:
            self.misses += 1
            if generation == self._generation and len(rows) <= self.max_rows // 4:
                if key not in self._rows:
                    self._rows[key] = rows
                    self._held += len(rows)
                while len(self._rows) > self.size or self._held > self.max_rows:
                    self._held -= len(self._rows.popitem(last=False)[1])
        return rows

    def floor(self, oldest: tuple[Any, ...]) -> None:
        """The oldest minute and hour summed now: a change means some instance pruned sums
        (or the first were written), so nothing kept is trusted."""
        with self._lock:
            if oldest != self._floor:
                self._floor = oldest
                self._clear()

    def clear(self) -> None:
        """Forget every row: settled rows were deleted (a prune)."""
        with self._lock:
            self._clear()

    def _clear(self) -> None:
        self._rows.clear()
        self._held = 0
        self._generation += 1
