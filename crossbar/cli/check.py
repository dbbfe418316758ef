"""A validated config described for a person to read (what `crossbar check` prints)."""

from __future__ import annotations

import time

from crossbar import build
from crossbar.config import (
    INTERACTIVE,
    Config,
    HostConfig,
    KeyConfig,
    Route,
    format_duration,
    format_size,
    hide_password,
    redact,
)


def _slots(value: int | None) -> str:
    return str(value) if value is not None else "from /props"


def _host_lines(host: HostConfig) -> list[str]:
    key = ""
    if host.api_key:
        key = f"  (api_key from ${host.api_key_env})" if host.api_key_env else "  (api_key set)"
    lines = [f"  {host.name}  {hide_password(host.url)}{key}"]
    if host.discover:
        lines.append(
            f"    models discovered from GET /models: parallel {_slots(host.parallel)}, "
            f"ctx {_slots(host.ctx)} each"
        )
    for m in host.models:
        upstream = f" -> {m.upstream}" if m.upstream else ""
        lines.append(
            f"    model {m.name}{upstream}: parallel {_slots(m.parallel)}, ctx {_slots(m.ctx)}"
        )
    warm = f"{host.cache_tokens} tokens" if host.cache_tokens else "learned from its evictions"
    lines.append(f"    keeps warm: {warm}")
    return lines


def _queue_share(config: Config, route: Route) -> str:
    """How the route shares the slot queues: "yes (priority 0, shared line, ...)"."""
    weight = "shared line" if route.weight is None else f"weight {route.weight:g}"
    cap = "unlimited" if route.max_in_flight is None else str(route.max_in_flight)
    bound = (
        f"{config.server.queue_max} from queue_max"
        if route.max_queued is None
        else str(route.max_queued)
    )
    return f"yes (priority {route.priority}, {weight}, max_in_flight {cap}, max_queued {bound})"


def _route_line(config: Config, route: Route) -> str:
    models = config.models_of(route)
    if any(config.hosts[h].discover for h in route.hosts if h in config.hosts):
        models.append("(and what the discovering hosts list)")
    parts = [
        f"hosts {', '.join(route.hosts)}",
        f"models {', '.join(models) or '-'}",
        f"default_model {route.default_model or '-'}",
        f"affinity {route.affinity}",
        f"queue {_queue_share(config, route)}" if route.queues() else "queue no",
        f"class {route.request_class}",
    ]
    if route.queues():
        batch = "what the turns leave" if route.batch_slots is None else str(route.batch_slots)
        parts.append(f"batch_slots {batch}")
    if route.aliases:
        shown = ", ".join(f"{glob} -> {model}" for glob, model in route.aliases)
        parts.append(f"aliases {shown}")
    parts.append(f"unknown_model {route.unknown_model}")
    if route.cors_origins:
        parts.append(f"cors {', '.join(route.cors_origins)}")
    if route.peers:
        parts.append(f"peers {', '.join(route.peers)}")
    if route.fallbacks:
        after = (
            f" (also after {format_duration(route.fallback_after)} waiting)"
            if route.fallback_after is not None
            else ""
        )
        parts.append(f"fallbacks {', '.join(route.fallbacks)}{after}")
    if route.rebalance:
        parts.append(
            f"rebalance after {format_duration(route.rebalance_after)} queued, conversations "
            f"idle {format_duration(route.rebalance_idle)}, {route.rebalance_per_minute}/min"
        )
    if route.valves():
        parts.append(
            f"valve margin {route.valve_margin:g}, slack {format_duration(route.valve_slack)}, "
            f"hold {format_duration(route.valve_hold)}"
        )
    elif route.queues() and not route.per_route():
        parts.append("valve off")
    if route.auth == "keys":
        anonymous = f" and {len(route.keys)} anonymous key(s)" if route.keys else ""
        parts.append(f"auth named keys{anonymous}")
    else:
        parts.append(f"{len(route.keys)} key(s)" if route.keys else "no client auth")
    return "; ".join(parts)


def describe(config: Config) -> str:
    """The resolved server settings, hosts, routes and templates; secrets only as "set"."""
    s = config.server
    out = [f"config {config.path or '(in memory)'}: ok", f"crossbar build: {build.describe()}"]
    out += ["", "server:"]
    token = "set" if s.admin_token else "unset (loopback only)"
    out.append(f"  listen {s.listen}; admin {s.admin_listen}; admin token {token}")
    out.append(f"  db {redact(s.db)}; default_route {s.default_route or '-'}")
    out.append(
        f"  lease_idle {format_duration(s.lease_idle)}; queue_max {s.queue_max}; "
        f"queue_timeout {format_duration(s.queue_timeout)}; max_body {format_size(s.max_body)}"
    )
    store = format_size(s.handoff_store) if s.handoff_store else "off"
    out.append(
        f"  handoff_store {store}; prewarm_parallel {s.prewarm_parallel}; "
        f"prewarm_timeout {format_duration(s.prewarm_timeout)}"
    )
    t = config.tracing
    if t is None:
        out.append("  tracing off")
    else:
        names = ", ".join(name for name, _ in t.headers)
        headers = f"; headers {names} (values hidden)" if names else ""
        out.append(
            f"  tracing to {hide_password(t.endpoint)} over {t.protocol} as {t.service_name}; "
            f"sample_ratio {t.sample_ratio:g}{headers}"
        )
    out += ["", f"hosts ({len(config.hosts)}):"]
    for host in config.hosts.values():
        out += _host_lines(host)
    out += ["", f"routes ({len(config.routes)}):"]
    for route in config.routes.values():
        out.append(f"  {route.name}: {_route_line(config, route)}")
    out += ["", f"templates ({len(config.templates)}, first match wins):"]
    for t in config.templates:
        out.append(f"  {t.name} (match {t.match!r}): {_route_line(config, t.route)}")
    out += ["", f"keys ({len(config.keys)}, seeded into the store; secrets never shown):"]
    for key in config.keys.values():
        out.append(f"  {key.name}: {_key_line(key)}")
    return "\n".join(out)


def _key_line(key: KeyConfig) -> str:
    limits = key.limits
    parts = [
        f"routes {', '.join(key.routes) or '(none)'}",
        f"models {', '.join(key.models) or 'any'}",
    ]
    for name in ("rpm", "tpm", "max_in_flight", "tokens_per_day", "tokens_per_month"):
        value = getattr(limits, name)
        if value is not None:
            parts.append(f"{name} {value}")
    parts.append(f"cached_weight {limits.cached_weight:g}")
    if limits.weight is not None:
        parts.append(f"weight {limits.weight:g}")
    if limits.request_class is not None:
        parts.append(f"class {limits.request_class}")
    if limits.max_class != INTERACTIVE:
        parts.append(f"max_class {limits.max_class}")
    if key.expires is not None:
        parts.append("expires " + time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(key.expires)))
    if key.blocked:
        parts.append("BLOCKED")
    return "; ".join(parts)
