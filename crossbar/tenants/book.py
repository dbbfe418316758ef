"""The named client keys of this instance, in memory: found by the hash of the secret a client
sends, checked in constant time, blocked and expired keys told apart from unknown ones.

The store holds the keys (several instances see the same ones); the book is what this instance
knows of them, replaced at start and changed by the admin API here and by the change log's
rows from the others (cluster/follower.py).

A lookup hashes the presented secret once (SHA-256) and finds the key by that hash: no loop
over every key, so its cost does not grow with their number, and what a timing can tell is
where a hash of the secret falls, which says nothing of the secret. The hash found is then
compared with `hmac.compare_digest`.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Iterable

from crossbar.config import hash_secret
from crossbar.tenants.values import ClientKey, KeyRefused

SECRET_PREFIX = "cb-"


def new_secret() -> str:
    """A fresh key secret: 256 random bits, URL-safe, prefixed so a leaked one is recognisable."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


class KeyBook:
    """Named keys by name, and by the hash of each valid secret (a rotated key's previous one
    too, until its grace ends)."""

    def __init__(self, keys: Iterable[ClientKey] = ()) -> None:
        self._keys: dict[str, ClientKey] = {}
        self._by_hash: dict[str, str] = {}
        self.replace(keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, name: object) -> bool:
        return name in self._keys

    def get(self, name: str) -> ClientKey | None:
        return self._keys.get(name)

    def names(self) -> list[str]:
        return sorted(self._keys)

    def all(self) -> list[ClientKey]:
        """Every key, by name."""
        return [self._keys[name] for name in sorted(self._keys)]

    def replace(self, keys: Iterable[ClientKey]) -> None:
        """Know exactly `keys` (the store's, at start or after a resync)."""
        self._keys = {}
        self._by_hash = {}
        for key in keys:
            self.put(key)

    def put(self, key: ClientKey) -> None:
        """Add or change a key."""
        self.remove(key.name)
        self._keys[key.name] = key
        self._by_hash[key.sha256] = key.name
        if key.old_sha256:
            self._by_hash.setdefault(key.old_sha256, key.name)

    def remove(self, name: str) -> None:
        old = self._keys.pop(name, None)
        if old is None:
            return
        for digest in (old.sha256, old.old_sha256):
            if digest and self._by_hash.get(digest) == name:
                del self._by_hash[digest]

    def identify(self, secret: str, now: float) -> ClientKey | None:
        """The key whose secret is `secret`, None for a secret no key has; KeyRefused (401)
        for a key that is blocked or expired, or a previous secret past its grace."""
        digest = hash_secret(secret)
        name = self._by_hash.get(digest)
        if name is None:
            return None
        key = self._keys[name]
        if hmac.compare_digest(digest, key.sha256):
            pass
        elif key.old_sha256 and hmac.compare_digest(digest, key.old_sha256):
            if now >= key.old_until:
                raise KeyRefused(
                    401, f"this secret of key {name!r} was rotated and its grace is over: "
                    "use the new secret",
                )  # fmt: skip
        else:  # pragma: no cover - the index and the key disagree: never, but never accept
            return None
        if key.blocked:
            raise KeyRefused(401, f"key {name!r} is blocked: ask the operator")
        if key.expired(now):
            raise KeyRefused(401, f"key {name!r} has expired: ask the operator for a new one")
        return key
