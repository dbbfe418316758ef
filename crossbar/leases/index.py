"""The lease table's in-memory index: leases by key, by route, and counted per host and model.

The chooser asks "how many leases does host H hold for model M" for every candidate of every new
lease, and "which hosts hold a lease of these peer routes"; both are counters kept up to date on
every put and drop, so neither scans the table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crossbar.leases.types import Key, Lease


class LeaseIndex:
    """Leases by key, with per-route sets and per-(host, model) / per-(route, model) counts."""

    def __init__(self) -> None:
        self._leases: dict[Key, Lease] = {}
        self._by_route: dict[str, dict[Key, None]] = {}  # dict as an ordered set
        self._per_host: Counter[tuple[str, str]] = Counter()  # (host, model) -> leases
        self._route_hosts: dict[tuple[str, str], Counter[str]] = {}  # (route, model) -> hosts
        self._routes: list[str] | None = None  # sorted route names, until a route comes or goes

    def __len__(self) -> int:
        return len(self._leases)

    def clear(self) -> None:
        """Hold nothing (the object stays: its holders keep reading it)."""
        self._leases.clear()
        self._by_route.clear()
        self._per_host.clear()
        self._route_hosts.clear()
        self._routes = None

    def get(self, key: Key) -> Lease | None:
        return self._leases.get(key)

    def all(self) -> Iterator[Lease]:
        return iter(list(self._leases.values()))

    def of_route(self, route: str) -> Iterator[Lease]:
        return (self._leases[key] for key in list(self._by_route.get(route, ())))

    def keys(self, route: str | None = None) -> list[Key]:
        if route is None:
            return list(self._leases)
        return list(self._by_route.get(route, ()))

    def routes(self) -> list[str]:
        """The routes holding leases, sorted (the list is kept until a route comes or goes:
        do not change it)."""
        if self._routes is None:
            self._routes = sorted(self._by_route)
        return self._routes

    def count_where(self, route: str | None, host: str | None, model: str | None) -> int:
        """Leases of `route` on `host` for `model` (None: any), from the counters: no scan."""
        if route is None:
            if host is None and model is None:
                return len(self._leases)
            return sum(
                n
                for (h, m), n in self._per_host.items()
                if (host is None or h == host) and (model is None or m == model)
            )
        if host is None and model is None:
            return len(self._by_route.get(route, ()))
        models = {model} if model is not None else {m for _, m in self._per_host}
        total = 0
        for m in models:
            hosts = self._route_hosts.get((route, m))
            if hosts:
                total += hosts.get(host, 0) if host is not None else sum(hosts.values())
        return total

    def route_hosts(self) -> dict[str, dict[str, int]]:
        """route -> host -> leases, summed over the route's models."""
        out: dict[str, dict[str, int]] = {}
        for (route, _model), hosts in self._route_hosts.items():
            counts = out.setdefault(route, {})
            for host, n in hosts.items():
                counts[host] = counts.get(host, 0) + n
        return out

    def count(self, host: str, model: str) -> int:
        return self._per_host.get((host, model), 0)

    def hosts_with_lease(self, routes: Iterable[str], model: str) -> set[str]:
        hosts: set[str] = set()
        for route in routes:
            hosts.update(self._route_hosts.get((route, model), ()))
        return hosts

    def fill(self, leases: list[Lease]) -> None:
        """Hold `leases` (distinct keys) in an empty index: `put` for each, in bulk."""
        assert not self._leases
        self._leases = {lease.key: lease for lease in leases}
        by_route = self._by_route
        for key in self._leases:
            keys = by_route.get(key.route)
            if keys is None:
                keys = by_route[key.route] = {}
            keys[key] = None
        self._routes = None
        self._per_host = Counter((lease.host, lease.key.model) for lease in leases)
        triples = Counter((lease.key.route, lease.key.model, lease.host) for lease in leases)
        for (route, model, host), n in triples.items():
            hosts = self._route_hosts.get((route, model))
            if hosts is None:
                hosts = self._route_hosts[(route, model)] = Counter()
            hosts[host] = n

    def put(self, lease: Lease) -> None:
        """Add `lease`, replacing any lease with its key."""
        key = lease.key
        route, _, model = key
        leases = self._leases
        if key in leases:
            self.drop(key)
        leases[key] = lease
        keys = self._by_route.get(route)
        if keys is None:
            keys = self._by_route[route] = {}
            self._routes = None
        keys[key] = None
        host = lease.host
        self._per_host[(host, model)] += 1
        hosts = self._route_hosts.get((route, model))
        if hosts is None:
            hosts = self._route_hosts[(route, model)] = Counter()
        hosts[host] += 1

    def drop(self, key: Key) -> Lease | None:
        """Remove the lease with `key`, if any, and return it."""
        lease = self._leases.pop(key, None)
        if lease is None:
            return None
        keys = self._by_route[key.route]
        del keys[key]
        if not keys:
            del self._by_route[key.route]
            self._routes = None
        _decrement(self._per_host, (lease.host, key.model))
        hosts = self._route_hosts[(key.route, key.model)]
        _decrement(hosts, lease.host)
        if not hosts:
            del self._route_hosts[(key.route, key.model)]
        return lease


def _decrement(counter: Counter, item: object) -> None:
    # Zero entries are deleted so the counters hold only what exists (no slow leak of old
    # routes and hosts, and `hosts_with_lease` never reports a host with no lease).
    counter[item] -= 1
    if counter[item] <= 0:
        del counter[item]
