"""Assemble crossbar's running parts from a config: store, hosts, limiter, lease table."""

from __future__ import annotations

from typing import Any

from crossbar.app import App
from crossbar.chooser import Chooser, Late
from crossbar.config import Config
from crossbar.forward import Upstream
from crossbar.guard import ContextGuard
from crossbar.hosts import Hosts
from crossbar.ids import IdMemory
from crossbar.lease import Table
from crossbar.limiter import Limiter
from crossbar.store import Store


async def build_app(config: Config, reactor: Any, store: Any = None, http: Any = None) -> App:
    """Open the store, restore draining and leases, and wire the chooser to live state.

    The chooser is built before the table it reads, so its callables look the table (and the
    current config, which a reload replaces) up when they are called.
    """
    s = config.server
    if store is None:
        store = await Store.open(s.db, reactor)
    hosts = Hosts(config, reactor, store=store, http=http)
    await hosts.load_draining()
    limiter = Limiter(reactor, hosts.parallel, s.queue_max, s.queue_timeout)
    hosts.add_listener(limiter.resized)
    table_ref: Late[Table] = Late()
    app_ref: Late[App] = Late()

    def peer_hosts(route: str, model: str) -> set[str]:
        resolved = app_ref.get().config.route(route)  # the current config: reloads change peers
        if resolved is None or not resolved.peers:
            return set()
        return table_ref.get().hosts_with_lease(resolved.peers, model)

    chooser = Chooser(
        load=lambda host, model: table_ref.get().count(host, model),
        parallel=hosts.parallel,
        free_slots=limiter.free_slots,
        peer_hosts=peer_hosts,
    )
    table = await Table.load(store, hosts, chooser, s.lease_idle, clock=reactor)
    table_ref.set(table)
    app = App(
        config=config,
        clock=reactor,
        store=store,
        table=table,
        hosts=hosts,
        limiter=limiter,
        upstream=Upstream(reactor, s.upstream_connect_timeout, s.upstream_idle_timeout),
        ids=IdMemory(size=s.remember_ids, ttl=s.lease_idle),
        guard=ContextGuard(),
    )
    app_ref.set(app)
    return app
