"""One lock per lease key, made when first needed and dropped when idle."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from twisted.internet.defer import CancelledError, DeferredLock

from crossbar.leases.types import Key

_T = TypeVar("_T")


class KeyLocks:
    """Runs calls for one key one at a time, calls for other keys side by side."""

    def __init__(self) -> None:
        self._locks: dict[Key, DeferredLock] = {}

    def __contains__(self, key: Key) -> bool:
        return key in self._locks

    def __len__(self) -> int:
        """Keys with a lock now (held or waited for)."""
        return len(self._locks)

    async def run(self, key: Key, fn: Callable[[], Awaitable[_T]]) -> _T:
        """`await fn()` holding `key`'s lock."""
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = DeferredLock()
        try:
            await lock.acquire()
        except CancelledError:
            self._forget(key, lock)
            raise
        try:
            return await fn()
        finally:
            lock.release()
            self._forget(key, lock)

    def _forget(self, key: Key, lock: DeferredLock) -> None:
        # release() may already have run the next waiter to completion, and it may have
        # dropped this lock and a newer caller made another: only drop our own, and only idle.
        if self._locks.get(key) is lock and not lock.locked and not lock.waiting:
            del self._locks[key]
