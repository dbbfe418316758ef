"""The hand-off store: each conversation's latest inference request body, on disk, compressed.

A warm hand-off replays a conversation's latest prompt on its new host before its next turn
(prewarm.py); this is where that prompt waits. Bodies are zlib-compressed into one file per
lease key in a private directory, at most `capacity` bytes in all (compressed), the least
recently used evicted first; a body over `max_body` is not kept (and the older one it would
have replaced is dropped: a stale prompt is no longer the conversation's latest).

Nothing here runs on the reactor thread but the bookkeeping of what was asked: every file
operation, compression included, runs in one worker thread of its own, in the order asked
(so a drop asked after a keep deletes what that keep wrote). A request never waits for it:
`keep` returns at once and the write happens after the answer has gone, in batches: one at
a time, each holding what was asked while the one before ran (a conversation's newer body
replacing its older), so a busy crossbar hands the thread one job per batch, not per request.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import zlib
from collections import OrderedDict
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

from crossbar.leases import Key

log = Logger(namespace="crossbar.handoff")
_LEVEL = 1  # prompts compress about 4x even at the fastest level; the thread's time matters more


def _name(key: Key) -> str:
    text = "\0".join((key.route, key.fp, key.model)).encode()
    return hashlib.sha256(text).hexdigest()[:32]


class _Files:
    """The directory and its index; touched only from the store's one worker thread."""

    def __init__(self, directory: str, capacity: int) -> None:
        self.directory = directory
        self.capacity = capacity
        self.sizes: OrderedDict[str, int] = OrderedDict()  # name -> compressed bytes, LRU first
        self.used = 0
        self.evicted = 0
        self.lock = threading.Lock()  # guards sizes/used against the reactor's stats reads

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def keep(self, name: str, body: bytes) -> None:
        data = zlib.compress(body, _LEVEL)
        if len(data) > self.capacity:
            self.drop(name)
            return
        tmp = self._path(name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, self._path(name))
        with self.lock:
            self.used += len(data) - self.sizes.pop(name, 0)
            self.sizes[name] = len(data)
        while self.used > self.capacity:
            with self.lock:
                oldest, size = self.sizes.popitem(last=False)
                self.used -= size
                self.evicted += 1
            self._unlink(oldest)

    def apply(self, batch: dict[str, bytes | None]) -> None:
        """Write the batch's bodies and delete its Nones, in order."""
        for name, body in batch.items():
            if body is None:
                self.drop(name)
            else:
                self.keep(name, body)

    def load(self, name: str) -> bytes | None:
        with self.lock:
            if name not in self.sizes:
                return None
            self.sizes.move_to_end(name)
        try:
            with open(self._path(name), "rb") as f:
                return zlib.decompress(f.read())
        except (OSError, zlib.error):
            self.drop(name)
            return None

    def drop(self, name: str) -> None:
        with self.lock:
            size = self.sizes.pop(name, None)
            if size is None:
                return
            self.used -= size
        self._unlink(name)

    def _unlink(self, name: str) -> None:
        try:
            os.unlink(self._path(name))
        except FileNotFoundError:
            pass


class HandoffStore:
    """Bounded, compressed, on-disk bodies by lease key; every call returns at once or a
    Deferred, never blocking the reactor. `capacity` 0: off (nothing kept, nothing found)."""

    def __init__(self, reactor: Any, capacity: int, max_body: int, parent: str | None) -> None:
        self._reactor = reactor
        self.capacity = capacity
        self.max_body = max_body
        self._files: _Files | None = None
        self._pool: ThreadPool | None = None
        if capacity > 0:
            directory = tempfile.mkdtemp(prefix="crossbar-handoff-", dir=parent)
            self._files = _Files(directory, capacity)
            self._pool = ThreadPool(1, 1, name="crossbar-handoff")
            self._pool.start()
        self._pending: dict[str, bytes | None] = {}  # asked, not yet handed to the thread
        self._waiters: list[Deferred[None]] = []
        self._writing = False

    @property
    def enabled(self) -> bool:
        return self._files is not None

    @property
    def directory(self) -> str | None:
        return None if self._files is None else self._files.directory

    def stats(self) -> dict[str, int]:
        """Bodies kept, their bytes on disk, the capacity and how many were evicted."""
        files = self._files
        if files is None:
            return {"bodies": 0, "bytes": 0, "capacity": 0, "evicted": 0}
        with files.lock:
            return {
                "bodies": len(files.sizes),
                "bytes": files.used,
                "capacity": files.capacity,
                "evicted": files.evicted,
            }

    def keep(self, key: Key, body: bytes) -> None:
        """Remember `body` as `key`'s latest; returns at once (the write is the thread's)."""
        if self._files is not None:
            self._pending[_name(key)] = body if len(body) <= self.max_body else None
            self._kick()

    def drop(self, key: Key) -> None:
        """Forget `key`'s body (its lease is gone)."""
        if self._files is not None:
            self._pending[_name(key)] = None
            self._kick()

    def load(self, key: Key) -> Deferred[bytes | None]:
        """`key`'s latest body, or None when none is kept."""
        name = _name(key)
        if self._files is None or name in self._pending:
            return succeed(None if self._files is None else self._pending[name])
        return self._run(self._files.load, name)

    def flushed(self) -> Deferred[None]:
        """Fires once everything asked so far is on disk (or deleted)."""
        if self._files is None:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._waiters.append(d)
        self._kick()
        return d

    def _kick(self) -> None:
        # One batch at a time: what arrives meanwhile waits in _pending, where a newer body of
        # a conversation replaces the older, so a busy crossbar writes each one once a batch.
        if self._files is None or self._writing or not (self._pending or self._waiters):
            return  # closed, busy, or nothing to do
        batch, self._pending = self._pending, {}
        waiters, self._waiters = self._waiters, []
        self._writing = True
        d = self._run(self._files.apply, batch)
        d.addBoth(self._written, waiters)

    def _written(self, _: object, waiters: list[Deferred[None]]) -> None:
        self._writing = False
        for waiter in waiters:
            waiter.callback(None)
        self._kick()

    def _run(self, fn: Any, *args: Any) -> Deferred[Any]:
        assert self._pool is not None
        d = deferToThreadPool(self._reactor, self._pool, fn, *args)

        def failed(failure: Any) -> None:
            log.failure("hand-off store: {fn} failed", failure, fn=fn.__name__)

        # Callers may ignore the result: a failure is logged here and never reaches them.
        d.addErrback(failed)
        return d

    def close(self) -> None:
        """Stop the worker (after what it was asked) and delete the directory."""
        if self._pool is not None:
            self._pool.stop()
            self._pool = None
        if self._files is not None:
            shutil.rmtree(self._files.directory, ignore_errors=True)
            self._files = None
