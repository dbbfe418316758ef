"""crossbar's parts built from a config, and the two sites that serve them.

`build_parts` opens the store and restores what it holds (draining flags, leases, pins); each
part is given only the collaborators it uses. The service and the test harness both build
their sites with `make_sites`, so what is tested is what runs.
"""

from __future__ import annotations

import gc
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from attrs import astuple, frozen
from twisted.internet.interfaces import IReactorTime
from twisted.web.iweb import IAgentEndpointFactory

from crossbar import __version__
from crossbar.admin import MAX_BODY, Admin, AdminParts, GenAIMetrics, Metrics
from crossbar.app.logs import log_request
from crossbar.app.sweep import Sweep
from crossbar.batches import BatchDesk, BatchRunner
from crossbar.cluster import Follower, Instances, KeyShare, SharedSlots
from crossbar.config import Config
from crossbar.handoff import HandoffParts, build_handoff
from crossbar.hosts import Hosts
from crossbar.leases import DEADLINE_SLACK, Chooser, Journal, Table, Warmth
from crossbar.limiter import Limiter
from crossbar.proxy import (
    AdminSite,
    ContextGuard,
    IdMemory,
    LoadedModels,
    Placement,
    ProxyResource,
    ProxySite,
    UsageRecorder,
    Valve,
)
from crossbar.store import Store
from crossbar.tenants import Tenants
from crossbar.tracing import build_tracing
from crossbar.wire import Upstream

if TYPE_CHECKING:
    from crossbar.tracing import Tracing

# Leases loaded at start from which their objects are frozen out of full collections.
_FREEZE_FROM = 10_000


@frozen
class Parts:
    """What a running crossbar is made of; only the composition (service, harness) holds it."""

    clock: IReactorTime
    store: Store
    journal: Journal
    hosts: Hosts
    limiter: Limiter
    table: Table
    warmth: Warmth
    upstream: Upstream
    ids: IdMemory
    guard: ContextGuard
    usage: UsageRecorder
    metrics: Metrics
    instances: Instances
    tenants: Tenants
    follower: Follower
    handoff: HandoffParts
    sweep: Sweep
    desk: BatchDesk
    batches: BatchRunner
    loaded: LoadedModels | None = None  # which models router-mode hosts have loaded
    tracing: Tracing | None = None  # [tracing]: spans, and the GenAI metrics beside them
    genai: GenAIMetrics | None = None

    def reloadable(self) -> list[Reconfigurable]:
        """The parts a reload reaches, in the order they take it: the order above, hosts
        first (a reload probes the hosts it adds before any other part sees them)."""
        return [part for part in astuple(self, recurse=False) if isinstance(part, Reconfigurable)]


@runtime_checkable
class Reconfigurable(Protocol):
    """A part that takes a reloaded config (the service awaits what it returns)."""

    def reconfigure(self, config: Config) -> Any: ...


async def build_parts(
    config: Config,
    reactor: Any,
    store: Store | None = None,
    endpoints: IAgentEndpointFactory | None = None,
    instance: str | None = None,
) -> Parts:
    """Open the store (unless given one), restore draining, leases and pins, and build every
    part on `reactor`. `endpoints` replaces TCP to the hosts (in-memory tests); `instance`
    names this crossbar among those sharing the store (a new id by default)."""
    s = config.server
    instance = instance or uuid.uuid4().hex[:12]
    if store is None:
        store = await Store.open(s.db, reactor, instance=instance, statements=s.store_timeout)
    elif not store.instance:
        store.instance = instance  # a store opened for us by a test
    instance = store.instance
    journal = Journal(store, reactor, deadline=s.store_timeout + DEADLINE_SLACK)
    hosts = Hosts(config, reactor, store=_GatedDrains(store, journal), endpoints=endpoints)
    await hosts.load_draining()

    instances = Instances(
        store, config, instance, __version__, reactor.seconds(), journal.report, reactor
    )
    limiter = Limiter(
        reactor, SharedSlots(hosts, instances), s.queue_max, s.queue_timeout, config, places=hosts
    )
    # What each part hears of the others, all here.
    instances.count_in_flight = limiter.total_in_flight
    instances.count_slots = limiter.in_flight_by_pair
    instances.listeners.append(limiter.resized_all)  # the shares may have changed
    hosts.add_listener(limiter.resized)  # discovery or a reload changed a host's slots
    since = await store.last_change()  # before the leases: what comes after, the follower applies
    warmth = Warmth(config, reactor)
    loaded = LoadedModels(hosts, limiter, warmth, reactor)
    hosts.model_listeners.append(loaded.model_event)
    if limiter.gate is not None:
        limiter.gate.on_open.append(loaded.opened)
    chooser = Chooser(
        limiter, held=hosts.held_down, known=hosts.knows_parallel, warmth=warmth, loads=loaded
    )
    table = await Table.load(store, hosts, chooser, s.lease_idle, journal)
    loaded.table = table
    table.listeners.append(warmth.lease_event)
    if len(table) >= _FREEZE_FROM:
        # The loaded leases live long: out of the collector's full passes, which otherwise
        # walk all of them (0.7 s at 100k leases) whenever enough new objects pile up.
        gc.collect()
        gc.freeze()
    tenants = Tenants(store, reactor, KeyShare(instances))
    await tenants.load(config)  # the config's keys seeded, every key of the store known
    follower = Follower(store, table.memory, hosts, instance, since, tenants)
    guard = ContextGuard()
    ids = IdMemory(size=s.remember_ids, ttl=s.lease_idle)
    usage = UsageRecorder(store, ids, guard, reactor, journal)
    upstream = Upstream(
        reactor,
        s.upstream_connect_timeout,
        s.upstream_idle_timeout,
        endpoints,
        max_connections=s.upstream_max_connections,
        connect_wait=s.upstream_connect_queue_timeout,
    )
    metrics = Metrics(
        config, table, hosts, limiter, guard, usage, instances, warmth, tenants, upstream
    )
    table.listeners.append(metrics.lease_event)
    hosts.model_listeners.append(metrics.model_event)
    usage.log_line = log_request
    usage.observers.append(metrics.observe)
    tracing = build_tracing(config, reactor, metrics.registry)
    genai = None
    if tracing is not None:
        genai = GenAIMetrics(metrics)
        usage.observers.append(genai.observe)
    handoff = build_handoff(
        config, reactor, table, hosts, limiter, upstream, usage, metrics.registry, tracing
    )
    sweep = Sweep(config, table, store, reactor)
    desk = BatchDesk(config, reactor, store, hosts)
    batches = BatchRunner(config, reactor, store, hosts)
    batches.spare = partial(_batch_spare, hosts, limiter, batches)
    metrics.batches = batches
    return Parts(
        reactor, store, journal, hosts, limiter, table, warmth, upstream, ids, guard, usage,
        metrics, instances, tenants, follower, handoff, sweep, desk, batches, loaded, tracing,
        genai,
    )  # fmt: skip


def _batch_spare(hosts: Hosts, limiter: Limiter, runner: BatchRunner) -> int:
    """The batch requests the healthy, non-draining hosts could start now under their batch
    caps (their batch room; a queue past a cap counts against it), what the batch runner
    claims by."""
    total = 0
    for name in hosts.names():
        if hosts.healthy(name) and not hosts.draining(name):
            for model in hosts.models(name):
                total += max(0, limiter.batch_room(name, model.name))
    return total


class _GatedDrains:
    """The store's draining flags, written through the journal's gate: refused while the
    store is degraded, and a failure degrades it."""

    def __init__(self, store: Store, journal: Journal) -> None:
        self._store = store
        self._journal = journal

    async def list_draining(self) -> set[str]:
        return await self._store.list_draining()

    async def set_draining(self, name: str, draining: bool) -> None:
        await self._journal.gate(lambda: self._store.set_draining(name, draining))


@frozen
class Sites:
    """The proxy's site and the admin API's, and the resources behind them."""

    proxy: ProxySite
    admin: AdminSite
    resource: ProxyResource
    api: Admin

    def reloadable(self) -> list[Reconfigurable]:
        """The sites and what serves behind them, for a reload."""
        return [self.proxy, self.admin, self.resource, self.api]


def make_sites(config: Config, parts: Parts, reload: Callable[[], Awaitable[list[str]]]) -> Sites:
    """The client-facing site and the admin site over `parts`; `reload` is what
    `POST /api/reload` calls."""
    p = parts
    placement = Placement(p.table, p.hosts, p.warmth, p.clock, p.loaded)
    valve = Valve(p.clock, p.table, p.hosts, p.limiter, p.warmth, p.loaded)
    resource = ProxyResource(
        config, p.clock, p.hosts, p.limiter, p.upstream, p.guard, p.ids, p.usage, placement,
        p.handoff.handoff, p.tenants, p.tracing, valve, p.loaded, p.desk,
    )  # fmt: skip
    p.batches.inside = resource.inside  # a batch's items go through the whole request path
    # An evacuation `now` (and a drain's grace) stops the streams the proxy runs.
    p.handoff.evacuator.streams = resource.resumer
    p.desk.created.append(lambda _: p.batches.refill())
    admin_parts = AdminParts(
        p.clock, p.table, p.journal, p.hosts, p.limiter, p.store, p.metrics, p.usage,
        p.instances, p.warmth, p.handoff.evacuator, p.handoff.store, p.tenants, p.batches,
    )  # fmt: skip
    api = Admin(config, admin_parts, reload)
    proxy = ProxySite(resource, config, reactor=p.clock)
    proxy.on_refused = p.usage.refused_early
    # One bound on the bodies both ports hold: the process's memory is one.
    admin = AdminSite(api.resource(), config, MAX_BODY, proxy.memory, reactor=p.clock)
    return Sites(proxy, admin, resource, api)
