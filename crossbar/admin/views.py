"""What the admin API answers, shaped from the live parts, and its query arguments."""

from __future__ import annotations

import math
from typing import Any

from crossbar.admin.facts import RouteFacts
from crossbar.config import RANK, Config, Route, parse_duration
from crossbar.hosts import Hosts
from crossbar.leases import Lease, Table, Warmth
from crossbar.limiter import Limiter, RouteState
from crossbar.wire import bad_request

MAX_BUCKETS = 2000  # points per route in a usage series
USAGE_SORTS = ("requests", "errors", "cache_hit_ratio")


def top_usage(rows: list[dict[str, Any]], sort: str, limit: int | None) -> list[dict[str, Any]]:
    """Usage rows with their cache_hit_ratio, sorted by `sort` (requests, errors: most first;
    cache_hit_ratio: worst first, groups without prompt tokens last), the first `limit` of
    them (all without a limit; in the rows' order for any other `sort`)."""
    for row in rows:
        prompt = row["prompt_tokens"] or 0
        row["cache_hit_ratio"] = (row["cached_tokens"] or 0) / prompt if prompt else None
    if sort == "cache_hit_ratio":
        rows = sorted(rows, key=lambda r: (r[sort] is None, r[sort] or 0.0))
    elif sort in USAGE_SORTS:
        rows = sorted(rows, key=lambda r: -(r[sort] or 0))
    return rows[:limit] if limit else rows


def lease_row(lease: Lease, now: float) -> dict[str, Any]:
    """One lease as JSON: its key, host, state and times (seconds since the epoch)."""
    return {
        "route": lease.key.route,
        "fp": lease.key.fp,
        "model": lease.key.model,
        "host": lease.host,
        "state": lease.state.value,
        "created": lease.created,
        "last_used": lease.last_used,
        "idle_for": max(0.0, now - lease.last_used),
    }


def route_rows(config: Config, facts: RouteFacts, names: list[str]) -> list[dict[str, Any]]:
    """The rows of the routes `names` (a page): config, pin, leases, requests, queue share."""
    rows = []
    for name in names:
        route = config.route(name)
        by_host = facts.by_host.get(name, {})
        rows.append(
            {
                "name": name,
                "configured": name in config.routes,  # a [routes.<name>] table of its own
                "served": route is not None,  # by that table or by a template
                "template": route.template if route is not None else None,
                "hosts": list(route.hosts) if route is not None else [],
                "default_model": route.default_model if route is not None else "",
                "affinity": route.affinity if route is not None else "",
                "queue": route.queue if route is not None else None,
                "peers": list(route.peers) if route is not None else [],
                "fallbacks": list(route.fallbacks) if route is not None else [],
                "fallback_after": route.fallback_after if route is not None else None,
                "auth": route.needs_key if route is not None else False,
                "pinned": facts.pins.get(name),
                "leases": sum(by_host.values()),
                "leases_by_host": dict(sorted(by_host.items())),
                "requests": facts.requests.get(name, 0),
                **_sharing(config, route, facts.active.get(name)),
            }
        )
    return rows


def _sharing(config: Config, route: Route | None, state: RouteState | None) -> dict[str, Any]:
    """A route's share of the slot queues: its limits (the config's, else the limiter's for a
    route the config no longer serves) and its requests in flight and queued on every host.
    `weight` null: the shared FIFO line; `max_in_flight` null: no cap; `max_queued` is the
    bound in force (the route's, else `queue_max`), null for a route that never queues."""
    limits = route.limits if route is not None else state.limits if state is not None else None
    queues = route is None or route.queues()
    return {
        "priority": limits.priority if limits is not None else None,
        "weight": limits.weight if limits is not None else None,
        "max_in_flight": limits.max_in_flight if limits is not None else None,
        "max_queued": (
            limits.queued_bound(config.server.queue_max) if limits is not None and queues else None
        ),
        "in_flight": state.in_flight if state is not None else 0,
        "queued": state.queued if state is not None else 0,
        "classes": {
            name: {
                "in_flight": state.by_class[rank] if state is not None else 0,
                "queued": state.waiting_by_class[rank] if state is not None else 0,
            }
            for name, rank in RANK.items()
        },
        "class": route.request_class if route is not None else None,
        "batch_slots": limits.batch_slots if limits is not None else None,
    }


def host_rows(
    hosts: Hosts, limiter: Limiter, table: Table, warmth: Warmth | None = None
) -> list[dict[str, Any]]:
    """Hosts.status() with, per model, the limiter's in flight, queued (in all and per route)
    and free slots, this instance's `share` of the host's `parallel` slots (all of them unless
    other instances share the store), the table's lease count, the host's learned rates, the
    prompt tokens its waiters will prefill and the expected wait; and per host the routes
    pinned to it and its cache truth (evictions, warm capacity; leases/warmth.py); a router-mode
    host's places (`router`: how many models it holds, which run, which the swap gate lets run)
    and each model's state as crossbar knows it and its load time."""
    pins = table.pins()
    rows = hosts.status()
    gate = limiter.gate
    for host in rows:
        name = host["name"]
        host["pinned_routes"] = sorted(route for route, h in pins.items() if h == name)
        if warmth is not None:
            host["cache"] = warmth.status(name)
        residency = hosts.residency(name)
        host["router"] = None
        if residency is not None:
            host["router"] = {
                **residency.status(),
                "open": [] if gate is None else gate.open_models(name),
                "closing": [] if gate is None else sorted(gate.closing(name)),
                "keep_loaded": list(hosts.kept(name)),
                "swap_after": hosts.swap_after(name),
            }
        for model in host["models"]:
            m = model["name"]
            if residency is not None:
                model["state"] = residency.state(m)
                model["load_seconds"] = round(limiter.rates.load(name, m), 3)
                model["load_seconds_source"] = limiter.rates.load_source(name, m)
            else:
                model["load_seconds"] = model["load_seconds_source"] = None
            model["in_flight"] = limiter.in_flight(name, m)
            model["queued"] = limiter.queued(name, m)
            model["queued_by_route"] = limiter.queued_by_route(name, m)
            model["classes"] = {
                c: {"in_flight": held, "queued": waiting}
                for c, (held, waiting) in limiter.by_class(name, m).items()
            }
            model["batch_slots"] = limiter.batch_cap(name, m)
            model["free"] = limiter.free_slots(name, m)
            model["share"] = limiter.parallel(name, m)
            model["leases"] = table.count(name, m)
            model.update(limiter.rates.status(name, m))
            model["queued_prefill_tokens"] = limiter.queued_prefill(name, m)
            wait = limiter.expected_wait(name, m)
            model["expected_wait_seconds"] = round(wait, 3) if math.isfinite(wait) else None
    return rows


def since_arg(text: str | None, now: float, default: float | None = None) -> float | None:
    """`since` as seconds since the epoch: a number is one, a duration ("90s", "2h") is that
    long ago. None (no argument) gives `default`. Anything else is a 400."""
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(value):
            return value
        raise bad_request(f"since: give a finite number of seconds, not {text!r}")
    try:
        return now - parse_duration(text)
    except ValueError:
        raise bad_request(
            f'since: give seconds since the epoch or a duration such as "1h", not {text!r}'
        ) from None


def usage_series_args(since: str | None, bucket: str | None, now: float) -> tuple[float, float]:
    """(since, bucket) of a usage series: default the last hour by the minute; at most
    MAX_BUCKETS buckets."""
    start = since_arg(since, now, default=now - 3600)
    assert start is not None
    if bucket is None or bucket == "":
        size = 60.0
    else:
        try:
            size = float(bucket)
        except ValueError:
            try:
                size = parse_duration(bucket)
            except ValueError:
                size = 0.0
    if not math.isfinite(size) or size <= 0:
        raise bad_request(f'bucket: give seconds or a duration such as "1m", not {bucket!r}')
    if (now - start) / size > MAX_BUCKETS:
        raise bad_request(
            f"bucket: {size:g}s makes more than {MAX_BUCKETS} buckets since {start:.0f}; "
            "choose a larger bucket or a later since"
        )
    return start, size
