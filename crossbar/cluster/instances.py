"""The crossbar instances sharing one store: who is alive, and this one's share of each host's
slots.

Each instance writes a heartbeat every `health_interval` (the database's clock, so machines'
clocks need not agree) with its requests in flight per (host, model), and reads everyone's; an
instance silent for three intervals is dead. The `parallel` slots of each (host, model) are
divided among the live instances by rank (their ids in order): `parallel // n` each, and one
more for the first `parallel % n`, so the shares sum to `parallel` and a host never sees more
requests from crossbar than it has slots. With more instances than slots each still gets one
(a host may then see up to one per instance).

A share counts only slots the others cannot be holding: each other instance may hold its own
share, or more where it reported more in flight (requests admitted under a larger share run
to their end: a shrink revokes nothing), or, if it has not beaten since this one came back
from a gap (frozen, SIGSTOP), the share it had without this one. And an instance that missed
its own heartbeats (its timer did not run) takes no share at all until its next beat has
landed and re-read the table: the others may have counted it dead and taken its slots. The
limiter is told to re-read every share after each heartbeat.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, Protocol

from attrs import asdict
from twisted.internet.interfaces import IReactorTime
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


def _no_slots() -> dict[tuple[str, str], int]:
    return {}


def encode_slots(slots: dict[tuple[str, str], int]) -> str:
    """Requests in flight per (host, model), as the heartbeat row keeps them."""
    return json.dumps({f"{h}\t{m}": n for (h, m), n in sorted(slots.items()) if n > 0})


def decode_slots(text: str) -> dict[tuple[str, str], int]:
    """What `encode_slots` wrote (nothing for a row of an older crossbar, or a bad one)."""
    try:
        raw = json.loads(text) if text else {}
    except ValueError:
        return {}
    out: dict[tuple[str, str], int] = {}
    for pair, n in raw.items() if isinstance(raw, dict) else ():
        host, _, model = str(pair).partition("\t")
        if isinstance(n, int) and n > 0:
            out[(host, model)] = n
    return out


def fair_share(parallel: int, live: list[str], instance: str) -> int:
    """`instance`'s part of `parallel` slots among `live` (ids in rank order)."""
    n = len(live)
    if n <= 1 or instance not in live:
        return parallel
    base, extra = divmod(parallel, n)
    return max(1, base + (1 if live.index(instance) < extra else 0))


class SharedSlots:
    """A host's slots as this instance may use them: its share of the host's `parallel`
    (the limiter's view of every (host, model))."""

    def __init__(self, hosts: Slots, instances: Instances) -> None:
        self._hosts = hosts
        self._instances = instances

    def __call__(self, host: str, model: str) -> int:
        return self._instances.share(self._hosts.parallel(host, model), (host, model))


class KeyShare:
    """This instance's part of each client key's limits (crossbar.tenants.Share): an equal
    fraction of its rates and budgets among the live instances, and of its requests in
    flight the way slots are divided."""

    def __init__(self, instances: Instances) -> None:
        self._instances = instances

    def fraction(self) -> float:
        live = self._instances.live
        return 1.0 / len(live) if self._instances.id in live and live else 1.0

    def part(self, total: int) -> int:
        return fair_share(total, self._instances.live, self._instances.id)


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
        clock: IReactorTime | None = None,
    ) -> None:
        """`report` hears a store that cannot be written; `clock` tells missed heartbeats
        (none: never). `listeners` hear that the shares may have changed (after each
        heartbeat); `count_in_flight` and `count_slots` are what each heartbeat reports."""
        self._store = store
        self._clock = clock
        self._interval = config.server.health_interval
        self._digest = config_digest(config)
        self.id = instance
        self.address = config.server.listen
        self._version = version
        self._started = started
        self.count_in_flight: Callable[[], int] = _nothing_in_flight
        self.count_slots: Callable[[], dict[tuple[str, str], int]] = _no_slots
        self.listeners: list[Callable[[], None]] = []
        self._others: dict[str, dict[tuple[str, str], int]] = {}  # live others' in flight
        self._unaware: set[str] = set()  # live others that have not beaten since we came back
        self._back_at = 0.0  # the database's time of our first beat after the last gap
        self._beating = False  # a beat is under way
        self._beat_ended: float | None = None  # local clock: when the last beat ended
        self._landing = False  # a beat begun after a gap has not landed yet
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

    def share(self, parallel: int, pair: tuple[str, str] | None = None) -> int:
        """This instance's part of `parallel` slots (of `pair`, whose use by the others is
        counted: see the module's docstring)."""
        if parallel <= 0:
            return parallel
        if self._landing or self._missed_beats():
            return 0  # the others may have counted us dead and taken our slots
        live = self._live
        mine = fair_share(parallel, live, self.id)
        if len(live) <= 1 or pair is None or parallel < len(live):
            return mine
        alone = [i for i in live if i != self.id]  # the live set as an unaware other sees it
        held = 0
        for other in alone:
            view = alone if other in self._unaware else live
            held += max(fair_share(parallel, view, other), self._others.get(other, {}).get(pair, 0))
        return max(0, min(mine, parallel - held))

    def _missed_beats(self) -> bool:
        """No beat under way, and none ended for longer than the others wait: the timer did
        not run (the process was frozen). A slow store's beat is under way, never missed."""
        if self._clock is None or self._beating or self._beat_ended is None:
            return False
        return self._clock.seconds() - self._beat_ended > DEAD_AFTER * self._interval

    async def beat(self) -> None:
        """Write this instance's heartbeat, read everyone's, re-divide the slots if the live
        set changed. Never raises (a timer calls it)."""
        self._landing = self._landing or self._missed_beats()  # back from a freeze
        row = InstanceRow(
            self.id, self.address, self._version, self._digest, self._started, 0.0,
            self.count_in_flight(), encode_slots(self.count_slots()),
        )  # fmt: skip
        self._beating = True
        try:
            self._now, self._rows = await self._store.heartbeat(row)
        except StoreError as e:
            self._report(e)
            if self._live == [self.id]:
                self._landing = False  # alone as far as we know: nobody took our slots
            return
        finally:
            self._beating = False
            if self._clock is not None:
                self._beat_ended = self._clock.seconds()
        cutoff = self._now - DEAD_AFTER * self._interval
        live = sorted({r.id for r in self._rows if r.heartbeat >= cutoff} | {self.id})
        if self._landing:
            # Back: the others that have not beaten since may still count us dead.
            self._back_at = self._now
            self._unaware = {r.id for r in self._rows if r.id in live and r.id != self.id}
            self._landing = False
        else:
            beats = {r.id: r.heartbeat for r in self._rows}
            self._unaware = {
                i for i in self._unaware if i in live and beats.get(i, 0.0) < self._back_at
            }
        self._others = {r.id: decode_slots(r.slots) for r in self._rows if r.id in live}
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
        for listener in list(self.listeners):  # the others' loads change every beat
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
