"""The warm hand-off's parts built over crossbar's: the store of bodies, the prewarmer, the
hand-off itself, evacuations and the rebalancer."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from attrs import frozen
from prometheus_client import CollectorRegistry

from crossbar.config import Config
from crossbar.handoff.evacuate import Evacuator
from crossbar.handoff.kept import HandoffStore
from crossbar.handoff.moves import HandOff
from crossbar.handoff.prewarm import Prewarmer
from crossbar.handoff.rebalance import Rebalancer
from crossbar.hosts import Hosts
from crossbar.leases import Chooser, Table
from crossbar.limiter import Limiter
from crossbar.proxy import UsageRecorder
from crossbar.wire import Upstream

if TYPE_CHECKING:
    from crossbar.tracing import Tracing


@frozen
class HandoffParts:
    """What a warm hand-off is made of."""

    store: HandoffStore
    prewarmer: Prewarmer
    handoff: HandOff
    evacuator: Evacuator
    rebalancer: Rebalancer

    def reconfigure(self, config: Config) -> None:
        """The reloaded config (a changed handoff_store size needs a restart)."""
        self.store.max_body = config.server.handoff_max_body
        self.handoff.reconfigure(config)
        self.evacuator.reconfigure(config)
        self.rebalancer.reconfigure(config)

    def close(self) -> None:
        """Stop the store's thread and delete its files."""
        self.store.close()


def store_parent(db: str) -> str | None:
    """Where the store's private directory goes: beside a SQLite file, else the temp dir."""
    if db == ":memory:" or "://" in db:
        return None
    return os.path.dirname(os.path.abspath(db))


def build_handoff(
    config: Config,
    clock: Any,
    table: Table,
    hosts: Hosts,
    limiter: Limiter,
    upstream: Upstream,
    usage: UsageRecorder,
    registry: CollectorRegistry,
    tracing: Tracing | None = None,
) -> HandoffParts:
    """The hand-off's parts; its metrics go to `registry`, its rows to `usage`, its spans to
    `tracing` (when on)."""
    s = config.server
    store = HandoffStore(clock, s.handoff_store, s.handoff_max_body, store_parent(s.db))
    prewarmer = Prewarmer(clock, config, hosts, limiter, upstream, store, usage, registry, tracing)
    handoff = HandOff(clock, config, table, store, prewarmer, registry, tracing)
    # Every subscription of the hand-off's parts, here and nowhere else.
    table.listeners.append(handoff.lease_event)
    usage.observers.append(handoff.observe)
    limiter.on_wait.append(prewarmer.client_waits)
    evacuator = Evacuator(clock, config, table, hosts, Chooser(limiter), handoff)
    rebalancer = Rebalancer(clock, config, table, hosts, limiter, handoff)
    return HandoffParts(store, prewarmer, handoff, evacuator, rebalancer)
