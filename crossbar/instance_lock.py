"""One crossbar per store file: a lock held for the life of the process."""

from __future__ import annotations

import fcntl
import os


class InstanceBusy(Exception):
    """Another crossbar holds the store file's lock."""


class InstanceLock:
    """An exclusive lock on `<db>.lock` for the life of one crossbar: a second instance on the
    same store file would keep its own lease table and pins and silently disagree with the
    first, so it refuses to start instead. The file holds the owner's pid, for the message."""

    def __init__(self, fd: int, path: str) -> None:
        self._fd = fd
        self.path = path

    @classmethod
    def take(cls, db: str) -> InstanceLock | None:
        """Lock the store at `db` (None for ":memory:" and URIs), or raise InstanceBusy naming
        the process that holds it."""
        if db == ":memory:" or db.startswith("file:"):
            return None
        path = db + ".lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return None  # the directory cannot take files: opening the store says why
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            owner = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise InstanceBusy(
                f"the store {db} is in use by another crossbar (pid {owner}); one instance per "
                "store file: stop the other one, or give this one another server.db"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(fd, path)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = -1
