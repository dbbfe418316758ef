"""A host as the admin API shows it: health, draining, its models' slots and context, and where
each number came from. Never the api key, nor a password in its URL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attrs import asdict

from crossbar.config import hide_password

if TYPE_CHECKING:
    from crossbar.hosts.entry import HostEntry


def host_status(
    name: str, host: HostEntry, draining: bool, now: float, window: float
) -> dict[str, Any]:
    """One host for GET /api/hosts; `now` on the hosts' clock, `window` the flap window."""
    health, last, flaps = host.health, host.health.last, host.flaps
    return {
        "name": name,
        "url": hide_password(host.config.url),
        "healthy": health.healthy,
        "draining": draining,
        "reason": health.reason,
        "flips": health.flips,
        "recent_falls": flaps.recent(now, window),
        "held_down": flaps.held(now),
        "held_for": max(0.0, flaps.held_until - now),  # seconds of hold-down left
        "consecutive_failures": health.bad,
        "consecutive_successes": health.good,
        "last_probe": None if last is None else asdict(last),
        "discover": host.config.discover,
        "models": [host.catalog.model_status(m) for m in host.catalog.models()],
    }
