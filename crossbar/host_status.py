"""A host as the admin API shows it: health, draining, its models' slots and context, and where
each number came from. Never the api key, nor a password in its URL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from attrs import asdict

from crossbar.config import ModelConfig

if TYPE_CHECKING:
    from crossbar.hosts import HostEntry, Hosts


def host_status(hosts: Hosts, name: str, host: HostEntry) -> dict[str, Any]:
    """One host for GET /api/hosts."""
    health, last = host.health, host.health.last
    return {
        "name": name,
        "url": _public_url(host.config.url),
        "healthy": health.healthy,
        "draining": hosts.draining(name),
        "reason": health.reason,
        "flips": health.flips,
        "consecutive_failures": health.bad,
        "consecutive_successes": health.good,
        "last_probe": None if last is None else asdict(last),
        "models": [_model_status(hosts, name, host, m) for m in host.config.models],
    }


def _model_status(hosts: Hosts, name: str, host: HostEntry, m: ModelConfig) -> dict[str, Any]:
    props = host.discovered.get(m.name)

    def source(configured: int | None, found: int | None) -> str:
        if configured is not None:
            return "config"
        return "props" if found else "default"

    return {
        "name": m.name,
        "upstream": m.upstream_name,
        "parallel": hosts.parallel(name, m.name),
        "parallel_source": source(m.parallel, props and props.total_slots),
        "ctx": hosts.ctx(name, m.name),
        "ctx_source": source(m.ctx, props and props.n_ctx),
    }


def _public_url(url: str) -> str:
    """The URL with any password hidden: a password in it is as secret as the api key."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
