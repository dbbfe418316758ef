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
        try:
            self._write(name, data)
        except FileNotFoundError:
            # The directory went (a tmp cleaner, an operator): its files with it. Make it
            # again, forget what it held, and write this one.
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            with self.lock:
                self.sizes.clear()
                self.used = 0
            self._write(name, data)
        with self.lock:
            self.used += len(data) - self.sizes.pop(name, 0)
            self.sizes[name] = len(data)
        self._evict()

    def _write(self, name: str, data: bytes) -> None:
        tmp = self._path(name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self._path(name))
        except OSError:
            self._unlink(name + ".tmp")  # a full disk leaves no half-written file behind
            raise

    def _evict(self) -> None:
        while self.used > self.capacity:
            with self.lock:
                oldest, size = self.sizes.popitem(last=False)
                self.used -= size
                self.evicted += 1
            self._unlink(oldest)

    def apply(self, batch: dict[str, bytes | None]) -> str | None:
        """Write the batch's bodies and delete its Nones, in order; why the last that failed
        did (a full disk, a directory that cannot be made), or None when all went."""
        failed = None
        for name, body in batch.items():
            try:
                if body is None:
                    self.drop(name)
                else:
                    self.keep(name, body)
            except OSError as e:
                failed = f"{e.strerror or e} ({self.directory})"
                with self.lock:  # whatever it held of this body is not there
                    self.used -= self.sizes.pop(name, 0)
        return failed

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
        except OSError:
            pass  # a file that cannot be deleted now is not kept in the index either


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
        self.error: str | None = None  # why the last batch could not be written, until one is

    @property
    def enabled(self) -> bool:
        return self._files is not None

    @property
    def directory(self) -> str | None:
        return None if self._files is None else self._files.directory

    def stats(self) -> dict[str, Any]:
        """Bodies kept, their bytes on disk, the capacity, how many were evicted, and why
        it cannot write now (None when it can)."""
        files = self._files
        if files is None:
            return {"bodies": 0, "bytes": 0, "capacity": 0, "evicted": 0, "error": None}
        with files.lock:
            return {
                "bodies": len(files.sizes),
                "bytes": files.used,
                "capacity": files.capacity,
                "evicted": files.evicted,
                "error": self.error,
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
        d.addBoth(self._written, waiters, bool(batch))

    def _written(self, failed: object, waiters: list[Deferred[None]], wrote: bool) -> None:
        self._writing = False
        failed = failed if isinstance(failed, str) else None
        if not wrote:  # a flush with nothing to write says nothing of the disk
            failed = self.error
        if failed and not self.error:
            log.error(
                "hand-off store cannot write: {why}; conversations move cold until it can",
                why=failed,
            )
        elif self.error and not failed:
            log.info("hand-off store writes again")
        self.error = failed
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
