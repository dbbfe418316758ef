"""The crossbar instances sharing one store: who is alive, and this one's share of each host's
slots.

Each instance writes a heartbeat every `health_interval` (the database's clock, so machines'
clocks need not agree) and reads everyone's; an instance silent for three intervals is dead.
The `parallel` slots of each (host, model) are divided among the live instances by rank (their
ids in order): `parallel // n` each, and one more for the first `parallel % n`, so the shares
sum to `parallel` and a host never sees more requests from crossbar than it has slots. With
more instances than slots each still gets one (a host may then see up to one per instance).
When the live set changes, the limiter is told to re-read every share.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, Protocol

from attrs import asdict
from twisted.logger import Logger

from crossbar.config import Config
from crossbar.store import InstanceRow, Store, StoreError

DEAD_AFTER = 3  # missed heartbeats
log = Logger(namespace="crossbar.instances")
_PRIVATE_SERVER_KEYS = ("listen", "admin_listen", "admin_token", "db")


def config_digest(config: Config) -> str:
    """A digest of what must agree between instances sharing a store: hosts, routes,
    templates and the server keys that shape routing (not listeners, tokens or the store)."""
    server = {k: v for k, v in asdict(config.server).items() if k not in _PRIVATE_SERVER_KEYS}
    shape = {
        "server": server,
        "hosts": {name: asdict(h) for name, h in config.hosts.items()},
        "routes": {name: asdict(r) for name, r in config.routes.items()},
        "templates": [asdict(t) for t in config.templates],
    }
    text = json.dumps(shape, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _nothing_in_flight() -> int:
    return 0


class SharedSlots:
    """A host's slots as this instance may use them: its share of the host's `parallel`
    (the limiter's view of every (host, model))."""

    def __init__(self, hosts: Slots, instances: Instances) -> None:
        self._hosts = hosts
        self._instances = instances

    def __call__(self, host: str, model: str) -> int:
        return self._instances.share(self._hosts.parallel(host, model))


class Slots(Protocol):
    """Slots per (host, model) as configured or discovered (crossbar.hosts.Hosts)."""

    def parallel(self, name: str, model: str) -> int: ...


class Instances:
    """This instance's heartbeat and its view of the others (`beat` on a timer)."""

    def __init__(
        self,
        store: Store,
        config: Config,
        instance: str,
        version: str,
        started: float,
        report: Callable[[BaseException], None],
    ) -> None:
        """`report` hears a store that cannot be written. `listeners` hear that the live set
        (so the shares) changed; `count_in_flight` is what each heartbeat reports."""
        self._store = store
        self._interval = config.server.health_interval
        self._digest = config_digest(config)
        self.id = instance
        self.address = config.server.listen
        self._version = version
        self._started = started
        self.count_in_flight: Callable[[], int] = _nothing_in_flight
        self.listeners: list[Callable[[], None]] = []
        self._report = report
        self._live: list[str] = [instance]
        self._rows: list[InstanceRow] = []
        self._now = 0.0
        self.mismatched: list[str] = []  # live instances whose config digest differs

    def reconfigure(self, config: Config) -> None:
        """A reload: a new interval and a new digest from the next heartbeat on."""
        self._interval = config.server.health_interval
        self._digest = config_digest(config)

    @property
    def live(self) -> list[str]:
        """Live instance ids, in rank order."""
        return list(self._live)

    def share(self, parallel: int) -> int:
        """This instance's part of `parallel` slots."""
        n = len(self._live)
        if n <= 1 or parallel <= 0:
            return parallel
        base, extra = divmod(parallel, n)
        rank = self._live.index(self.id)
        return max(1, base + (1 if rank < extra else 0))

    async def beat(self) -> None:
        """Write this instance's heartbeat, read everyone's, re-divide the slots if the live
        set changed. Never raises (a timer calls it)."""
        row = InstanceRow(
            self.id, self.address, self._version, self._digest, self._started, 0.0,
            self.count_in_flight(),
        )  # fmt: skip
        try:
            self._now, self._rows = await self._store.heartbeat(row)
        except StoreError as e:
            self._report(e)
            return
        cutoff = self._now - DEAD_AFTER * self._interval
        live = sorted({r.id for r in self._rows if r.heartbeat >= cutoff} | {self.id})
        mismatched = sorted(r.id for r in self._rows if r.id in live and r.digest != self._digest)
        if mismatched != self.mismatched and mismatched:
            log.warn(
                "instances {ids} run another config than this one ({digest}): their routing "
                "may disagree with this one's",
                ids=", ".join(mismatched),
                digest=self._digest,
            )
        self.mismatched = mismatched
        beats = {r.id: r.heartbeat for r in self._rows}
        for gone in sorted(set(self._live) - set(live)):
            if gone not in beats:
                log.info("instance {id} left (a clean stop)", id=gone)
                continue
            log.warn(
                "instance {id} last beat {ago:.1f} s ago: counted dead, its slot share goes "
                "to the others",
                id=gone,
                ago=self._now - beats[gone],
            )
        if live != self._live:
            log.info(
                "instances alive: {n} ({ids}); this one is {me}",
                n=len(live),
                ids=", ".join(live),
                me=self.id,
            )
            self._live = live
            for listener in list(self.listeners):
                listener()

    async def leave(self) -> None:
        """Stop being counted at once (a clean stop)."""
        try:
            await self._store.forget_instance(self.id)
        except StoreError:
            pass  # the others count it dead after three heartbeats instead

    def status(self) -> list[dict[str, Any]]:
        """Every instance the store knows, for GET /api/instances."""
        cutoff = self._now - DEAD_AFTER * self._interval
        return [
            {
                "id": r.id,
                "address": r.address,
                "version": r.version,
                "config_digest": r.digest,
                "config_matches": r.digest == self._digest,
                "started": r.started,
                "last_heartbeat": r.heartbeat,
                "seconds_since_heartbeat": max(0.0, self._now - r.heartbeat),
                "alive": r.heartbeat >= cutoff,
                "in_flight": r.in_flight,
                "this": r.id == self.id,
            }
            for r in self._rows
        ]
