"""What every route's row in an admin answer rests on, gathered once per answer, and the
natural order routes are shown in."""

from __future__ import annotations

import functools
import re
from typing import Any

from attrs import frozen

from crossbar.config import Config
from crossbar.leases import Table
from crossbar.limiter import Limiter, RouteState


@functools.lru_cache(maxsize=65536)
def natural(name: str) -> tuple[Any, ...]:
    """A sort key putting team-2 before team-10 (remembered: a thousand routes are sorted on
    every refresh of the dashboard)."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


@frozen
class RouteFacts:
    """What every route's place in a page needs, gathered once per answer: the routes in
    order (configured ones in config order, then the rest in natural order), their leases per
    host, requests, pins and limiter state."""

    names: list[str]
    by_host: dict[str, dict[str, int]]
    requests: dict[str, int]
    pins: dict[str, str]
    active: dict[str, RouteState]

    def leases(self, name: str) -> int:
        return sum(self.by_host.get(name, {}).values())


def route_facts(
    config: Config, table: Table, usage: list[dict[str, Any]], limiter: Limiter
) -> RouteFacts:
    """The concrete routes, then every other route seen: a route from a template, or one the
    config no longer serves, that holds leases, a pin, usage, or requests in the limiter.
    Lease counts come from the table's counters, so this costs per route, not per lease."""
    by_host = table.leases_by_route()
    pins = table.pins()
    requests = {row["route"]: row["requests"] for row in usage}
    active = limiter.routes()
    seen = set(by_host) | set(pins) | set(requests)
    seen |= {name for name in active if name}  # "": requests that named no route
    names = list(config.routes) + sorted(seen - set(config.routes), key=natural)
    return RouteFacts(names, by_host, requests, pins, active)
