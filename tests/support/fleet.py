"""Several crossbar services (in this process, each its own config file, store connection and
ports) on one store, in front of shared fake hosts: the stories of instances that must behave
as one crossbar."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attrs import define
from twisted.internet import reactor
from twisted.internet.defer import DeferredList, ensureDeferred
from twisted.internet.task import deferLater

from crossbar.testing.fakellama import FakeLlama
from tests.support.admin_harness import Running, start_service, write_config
from tests.support.harness import wait


@define
class Fleet:
    """Running instances, the fakes they share, and how to make more."""

    tmp: Path
    db: str
    fakes: dict[str, FakeLlama]
    routes: dict[str, Any]
    server: dict[str, Any]
    hosts: dict[str, Any] | None
    instances: list[Running]
    keys: dict[str, Any] | None = None

    async def add(self) -> Running:
        """One more instance on the same store."""
        path = self.tmp / f"crossbar-{len(self.instances)}.toml"
        server = {"db": self.db, **self.server}
        write_config(path, self.fakes, self.routes, server=server, hosts=self.hosts, keys=self.keys)
        running = await start_service(path, {})  # the fakes belong to the fleet
        self.instances.append(running)
        return running

    async def stop(self) -> None:
        for running in self.instances:
            await running.stop()
        for fake in self.fakes.values():
            await fake.stop()


async def start_fleet(
    tmp: Path,
    db: str,
    fakes: dict[str, FakeLlama],
    routes: dict[str, Any],
    n: int = 2,
    server: dict[str, Any] | None = None,
    hosts: dict[str, Any] | None = None,
    keys: dict[str, Any] | None = None,
) -> Fleet:
    """`n` instances on the store `db`; each has seen the others' heartbeats."""
    server = {"health_interval": "500ms", **(server or {})}
    fleet = Fleet(tmp, db, fakes, routes, server, hosts, [], keys)
    for _ in range(n):
        await fleet.add()
    await everyone_beats(fleet)
    return fleet


async def everyone_beats(fleet: Fleet) -> None:
    """One heartbeat from each instance, in turn, so each knows every other."""
    for _ in range(2):
        await beat_all(fleet.instances)


async def beat_all(instances: list[Running]) -> None:
    """A heartbeat from each of `instances`, all at once."""
    await wait(DeferredList([ensureDeferred(r.parts.instances.beat()) for r in instances]))


async def within(predicate, seconds: float, step: float = 0.01) -> float:
    """Wait for `predicate()` to hold (another instance's change arriving); how long it took.
    Fails after `seconds`."""
    started = reactor.seconds()
    while not predicate():
        if reactor.seconds() - started > seconds:
            raise AssertionError(f"not within {seconds} s")
        await deferLater(reactor, step, lambda: None)
    return reactor.seconds() - started


def percentile(values: list[float], p: float) -> float:
    ranked = sorted(values)
    return ranked[min(len(ranked) - 1, int(p * len(ranked)))]
