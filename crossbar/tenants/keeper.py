"""The named keys of a running crossbar: seeded from the config into the store, known in
memory (the book), followed from the other instances, changed by the operator, and what they
spent synced between the instances sharing the store."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from attrs import evolve
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from crossbar.config import Config, KeyLimits, hash_secret
from crossbar.tenants.book import KeyBook, new_secret
from crossbar.tenants.meter import ALONE, KeyMeter, Share, period_ids, period_start
from crossbar.tenants.values import API, CONFIG, ClientKey, from_config, key_view

log = Logger(namespace="crossbar.keys")
SYNC_EVERY = 1.0  # seconds between spending syncs: a budget's view of the others lags this much


class KeyStore(Protocol):
    """What the keys need of the store (crossbar.store.Store)."""

    async def list_keys(self, names: Iterable[str] | None = None) -> list[ClientKey]: ...

    async def seed_keys(self, seeds: list[ClientKey]) -> list[ClientKey]: ...

    async def create_key(self, key: ClientKey) -> bool: ...

    async def save_key(self, key: ClientKey) -> None: ...

    async def delete_key(self, name: str) -> bool: ...

    async def sync_spend(
        self, rows: list[tuple[str, str, float, float]], periods: list[str]
    ) -> dict[tuple[str, str], float]: ...


class KeyActionRefused(Exception):
    """An operator's key action that cannot be done: `status` 404, 409 or 400."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Tenants:
    """The book, the meter, and the store behind them."""

    def __init__(self, store: KeyStore, clock: IReactorTime, share: Share = ALONE) -> None:
        self._store = store
        self._clock = clock
        self.book = KeyBook()
        self.meter = KeyMeter(share)
        self.sync_errors = 0

    async def load(self, config: Config) -> None:
        """Seed the config's keys and know every key of the store (start and reload)."""
        now = self._clock.seconds()
        seeds = [from_config(k, now) for k in config.keys.values()]
        keys = await self._store.seed_keys(seeds)
        self.book.replace(keys)
        for name in [n for n in list(self.meter._states) if n not in self.book]:
            self.meter.forget(name)

    async def reconfigure(self, config: Config) -> None:
        """A reload: the file's `[keys.*]` seeded again (unchanged entries keep their state)."""
        try:
            await self.load(config)
        except Exception as e:  # a store that cannot be written keeps the keys it had
            log.error("reload: the client keys could not be seeded: {e}", e=str(e))

    async def refresh(self, names: Iterable[str]) -> None:
        """Other instances changed these keys: read them again (the follower)."""
        names = set(names)
        found = {k.name: k for k in await self._store.list_keys(names)}
        for name in names:
            key = found.get(name)
            if key is None:
                self.book.remove(name)
                self.meter.forget(name)
            else:
                self.book.put(key)

    async def resync(self) -> None:
        """Read every key again (the change log was pruned past this instance)."""
        self.book.replace(await self._store.list_keys())

    async def sync(self) -> None:
        """Write this instance's spending, read the others' (a timer; never raises)."""
        now = self._clock.seconds()
        written = self.meter.pending()
        rows = [(k, p, spent, period_start(p)) for k, p, spent in written]
        try:
            others = await self._store.sync_spend(rows, list(period_ids(now)))
        except Exception as e:
            self.sync_errors += 1
            log.warn("could not sync key spending with the store: {e}", e=str(e))
            return
        self.meter.synced(written, others)

    # -- the operator's actions

    def show(self, name: str) -> dict[str, Any]:
        key = self._known(name)
        now = self._clock.seconds()
        return {**key_view(key, now), "used": self.meter.status(key, now)}

    def list(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Every key (or those of `names` that exist), by name, as `show` tells each."""
        known = self.book.names()
        if names is not None:
            wanted = set(names)
            known = [name for name in known if name in wanted]
        return [self.show(name) for name in known]

    async def create(
        self,
        name: str,
        routes: tuple[str, ...],
        models: tuple[str, ...],
        limits: KeyLimits,
        expires: float | None,
    ) -> tuple[ClientKey, str]:
        """A new key and its secret (shown once, kept nowhere)."""
        if name in self.book:
            raise KeyActionRefused(409, f"a key named {name!r} exists; choose another name")
        secret = new_secret()
        key = ClientKey(
            name=name,
            sha256=hash_secret(secret),
            routes=routes,
            models=models,
            expires=expires,
            limits=limits,
            created=self._clock.seconds(),
            source=API,
        )
        if not await self._store.create_key(key):
            raise KeyActionRefused(409, f"a key named {name!r} exists; choose another name")
        self.book.put(key)
        log.info("admin: key {name} created", name=name)
        return key, secret

    async def block(self, name: str, blocked: bool) -> ClientKey:
        key = evolve(self._known(name), blocked=blocked)
        await self._store.save_key(key)
        self.book.put(key)
        log.info("admin: key {name} {what}", name=name, what="blocked" if blocked else "unblocked")
        return key

    async def rotate(self, name: str, grace: float) -> tuple[ClientKey, str]:
        """A new secret; the current one stays valid for `grace` seconds."""
        old = self._known(name)
        secret = new_secret()
        now = self._clock.seconds()
        key = evolve(
            old,
            sha256=hash_secret(secret),
            old_sha256=old.sha256 if grace > 0 else "",
            old_until=now + grace if grace > 0 else 0.0,
        )
        await self._store.save_key(key)
        self.book.put(key)
        log.info("admin: key {name} rotated (grace {grace:g} s)", name=name, grace=grace)
        return key, secret

    async def delete(self, name: str) -> None:
        key = self._known(name)
        if key.source == CONFIG:
            raise KeyActionRefused(
                409, f"key {name!r} comes from the config: remove [keys.{name}] from the file "
                "and reload (or block it now)",
            )  # fmt: skip
        await self._store.delete_key(name)
        self.book.remove(name)
        self.meter.forget(name)
        log.info("admin: key {name} deleted", name=name)

    def _known(self, name: str) -> ClientKey:
        key = self.book.get(name)
        if key is None:
            raise KeyActionRefused(404, f"no key named {name!r}")
        return key
