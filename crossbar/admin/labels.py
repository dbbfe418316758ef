"""The label values of crossbar's metrics, bounded by the config (docs/reference.md, "Metrics").

A route's `route` label is its name when the config has a `[routes.<name>]` table for it or
lists it in `server.metrics_routes`; `template:<name>` for every other route a template serves
(a thousand `team-*` routes make one series per host and model, not a thousand); "(unknown)"
for a route no config serves, so a scanner inventing names cannot grow the series either.
Hosts no config names are "(unknown)" too. On a reload, the series whose route or host the new
config no longer has are dropped (`Seen.forget_stale`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from crossbar.config import Config

UNKNOWN = "(unknown)"


def route_label(config: Config, name: str) -> str:
    """The `route` label of `name`: its own, its template's, or "(unknown)"."""
    if name in config.routes:
        return name
    route = config.route(name)
    if route is None:
        return UNKNOWN
    if route.template is not None and name not in config.server.metrics_routes:
        return f"template:{route.template}"
    return name


def label_stands(config: Config, label: str) -> bool:
    """Whether a `route` label still names something under `config`."""
    if label == UNKNOWN or label in config.routes:
        return True
    if label.startswith("template:"):
        return any(t.name == label[len("template:") :] for t in config.templates)
    return label in config.server.metrics_routes and config.route(label) is not None


def host_stands(config: Config, host: str) -> bool:
    """Whether a `host` label still names something under `config`."""
    return host in ("", UNKNOWN) or host in config.hosts


class Seen:
    """The label sets each labelled metric was given, so a reload can drop stale series
    (prometheus_client keeps a child per label set until it is removed)."""

    def __init__(self) -> None:
        self._sets: dict[Any, set[tuple[str, ...]]] = {}

    def labels(self, metric: Any, *values: str) -> Any:
        """`metric.labels(*values)`, remembered."""
        self._sets.setdefault(metric, set()).add(values)
        return metric.labels(*values)

    def forget_stale(self, stale: Callable[[tuple[str, ...]], bool]) -> int:
        """Remove every series whose label values are `stale`; how many went."""
        removed = 0
        for metric, sets in self._sets.items():
            for values in [v for v in sets if stale(v)]:
                metric.remove(*values)
                sets.discard(values)
                removed += 1
        return removed
