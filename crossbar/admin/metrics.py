"""Prometheus metrics of one crossbar (docs/reference.md, "Metrics"), on a registry of its own.

Request numbers come from the usage rows (a `UsageRecorder` observer); lease changes from the
table's listeners; everything that is a state rather than a count (in flight, queued, leases,
host health, the cache-hit ratio) and the counters other parts keep (the guard's, the
limiter's, the prober's) are read from the live objects when Prometheus scrapes (live.py), so
they can never drift from what the admin API shows.

Label values are bounded by the config (labels.py): a route a template serves is
labelled `template:<name>` unless `server.metrics_routes` lists it, a route or host no config
names is "(unknown)", and a reload drops the series of routes and hosts it removed.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from crossbar.admin.labels import UNKNOWN, Seen, host_stands, label_stands, route_label
from crossbar.admin.live import Live
from crossbar.batches import BatchRunner
from crossbar.cluster import Instances
from crossbar.config import Config
from crossbar.hosts import Hosts, ModelEvent
from crossbar.leases import Table, Warmth
from crossbar.limiter import Limiter
from crossbar.proxy import ContextGuard, UsageRecorder
from crossbar.records import LeaseEvent, UsageRow
from crossbar.tenants import Tenants
from crossbar.wire import Upstream

__all__ = ["CONTENT_TYPE_LATEST", "UNKNOWN", "Metrics", "route_label"]

# Rows' label sets kept worked out (a config's routes x hosts x models x statuses is far less).
_MAX_SERIES = 10_000
OTHER_KEYS = "(other)"  # the label of every key server.metrics_keys does not list
# Seconds: a queue wait or a first byte ranges from a free slot (ms) to a long prefill (minutes).
_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class _Series:
    """The labelled children one kind of row counts in, each made (and remembered for a
    reload's pruning) the first time it is needed."""

    __slots__ = ("_children", "_metrics", "_seen", "route")

    def __init__(self, route: str, seen: Seen, metrics: dict[str, tuple[Any, tuple[str, ...]]]):
        self.route = route
        self._seen = seen
        self._metrics = metrics
        self._children: dict[str, Any] = {}

    def child(self, name: str) -> Any:
        child = self._children.get(name)
        if child is None:
            metric, values = self._metrics[name]
            child = self._children[name] = self._seen.labels(metric, *values)
        return child


class Metrics:
    """crossbar's metrics: `observe` hears usage rows, `lease_event` lease changes; `render`
    is the /metrics body."""

    def __init__(
        self,
        config: Config,
        table: Table,
        hosts: Hosts,
        limiter: Limiter,
        guard: ContextGuard,
        usage: UsageRecorder | None = None,
        instances: Instances | None = None,
        warmth: Warmth | None = None,
        tenants: Tenants | None = None,
        upstream: Upstream | None = None,
    ) -> None:
        self.config = config
        self.upstream = upstream
        self.tenants = tenants
        self.warmth = warmth
        self.table = table
        self.hosts = hosts
        self.limiter = limiter
        self.guard = guard
        self.usage = usage
        self.instances = instances
        self.batches: BatchRunner | None = None  # this instance's batch runner (wiring sets it)
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "crossbar_requests",
            "Requests crossbar answered, by route, host, model and HTTP status.",
            ["route", "host", "model", "status"],
            registry=r,
        )
        self.request_errors = Counter(
            "crossbar_request_errors",
            "Requests that failed (status >= 400, or broken mid-stream).",
            ["route", "host", "model"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "crossbar_queue_wait_seconds",
            "Time inference requests waited for a slot, by route (templates folded), host, model.",
            ["route", "host", "model"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.ttfb = Histogram(
            "crossbar_ttfb_seconds",
            "Time from a request's arrival to the first response byte from its host.",
            ["route", "host", "model"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "crossbar_tokens",
            "Tokens by kind: prompt (all of it), cached (of the prompt), completion.",
            ["route", "host", "model", "kind"],
            registry=r,
        )
        self.lease_events = Counter(
            "crossbar_lease_events",
            "Lease changes by reason: leases born, moved, dropped; routes pinned and unpinned.",
            ["reason"],
            registry=r,
        )
        self.lease_moves = Counter(
            "crossbar_lease_moves",
            "Conversations moved from one host to another (their prompt cache is lost), by reason.",
            ["reason"],
            registry=r,
        )
        self.fallbacks = Counter(
            "crossbar_fallbacks",
            "Requests a fallback route served, by the route they came for (templates folded), "
            "the route that served them and why their own could not.",
            ["route", "to", "reason"],
            registry=r,
        )
        self.key_requests = Counter(
            "crossbar_key_requests",
            'Requests of named client keys, by key (keys not in server.metrics_keys: "(other)").',
            ["key"],
            registry=r,
        )
        self.model_loads = Counter(
            "crossbar_model_loads",
            "Model loads on router-mode hosts crossbar saw or caused, by host, model and "
            "reason (request, keep, operator, router).",
            ["host", "model", "reason"],
            registry=r,
        )
        self.model_unloads = Counter(
            "crossbar_model_unloads",
            "Model unloads (and failed loads: reason failed) on router-mode hosts crossbar saw "
            "or caused, by host, model and reason (swap, operator, router).",
            ["host", "model", "reason"],
            registry=r,
        )
        self.key_tokens = Counter(
            "crossbar_key_tokens",
            "Tokens of named client keys by key and kind: prompt, cached, completion.",
            ["key", "kind"],
            registry=r,
        )
        # The ratio is cached/prompt over all requests so far, per route.
        self._prompt: dict[str, int] = defaultdict(int)
        self._cached: dict[str, int] = defaultdict(int)
        self._seen = Seen()
        self._seen_keys = Seen()  # the key metrics' label sets, for a reload to prune
        self._seen_fallbacks = Seen()
        self._series: dict[tuple[str, str, str, int], _Series] = {}
        r.register(Live(self))

    def reconfigure(self, config: Config) -> None:
        """Label by the reloaded config's routes, hosts and models; drop the series of the
        routes and hosts it no longer has."""
        self.config = config
        self._series.clear()

        def stale(values: tuple[str, ...]) -> bool:
            route, host = values[0], values[1]
            return not (label_stands(config, route) and host_stands(config, host))

        self._seen.forget_stale(stale)
        listed = config.server.metrics_keys
        self._seen_keys.forget_stale(lambda v: v[0] != OTHER_KEYS and v[0] not in listed)
        self._seen_fallbacks.forget_stale(
            lambda v: not (label_stands(config, v[0]) and label_stands(config, v[1]))
        )
        for route in [r for r in self._prompt if not label_stands(config, r)]:
            del self._prompt[route]
            self._cached.pop(route, None)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

    # -- what happened

    def observe(self, row: UsageRow) -> None:
        """One finished request (a UsageRecorder observer)."""
        if row.lease == "prewarm":
            return  # crossbar's own hand-off work, counted apart (handoff/prewarm.py)
        key = (row.route, row.host, row.model, row.status)
        series = self._series.get(key)
        if series is None:
            series = self._series_of(row)
        series.child("requests").inc()
        if row.status >= 400 or row.error:
            series.child("errors").inc()
        if row.queue_ms is not None and row.host:
            series.child("queue").observe(row.queue_ms / 1000)
        if row.ttfb_ms is not None:
            series.child("ttfb").observe(row.ttfb_ms / 1000)
        if row.prompt_tokens:
            series.child("prompt").inc(row.prompt_tokens)
            self._prompt[series.route] += row.prompt_tokens
            self._cached[series.route] += row.cached_tokens
        if row.cached_tokens:
            series.child("cached").inc(row.cached_tokens)
        if row.completion_tokens:
            series.child("completion").inc(row.completion_tokens)
        if row.key:
            self._observe_key(row)
        if row.fallback_from:
            config = self.config
            labels = (route_label(config, row.fallback_from), route_label(config, row.route))
            self._seen_fallbacks.labels(self.fallbacks, *labels, row.fallback_reason).inc()

    def key_label(self, name: str) -> str:
        """A key's label: its name if `server.metrics_keys` lists it, else "(other)" (the
        keys the admin API makes are the operator's to list, not a series each)."""
        return name if name in self.config.server.metrics_keys else OTHER_KEYS

    def _observe_key(self, row: UsageRow) -> None:
        label = self.key_label(row.key)
        self._seen_keys.labels(self.key_requests, label).inc()
        for kind, n in (
            ("prompt", row.prompt_tokens),
            ("cached", row.cached_tokens),
            ("completion", row.completion_tokens),
        ):
            if n:
                self._seen_keys.labels(self.key_tokens, label, kind).inc(n)

    def _series_of(self, row: UsageRow) -> _Series:
        """The series a row counts in: its labels worked out once per (route, host, model,
        status) and kept while they stand (until a reload). A model no host serves is
        labelled "(unknown)" and worked out each time: it may be served later."""
        route, host, model = self._labels(row)
        seen = self._seen
        metrics = {
            "requests": (self.requests, (route, host, model, str(row.status))),
            "errors": (self.request_errors, (route, host, model)),
            "queue": (self.queue_wait, (route, host, model)),
            "ttfb": (self.ttfb, (route, host, model)),
            "prompt": (self.tokens, (route, host, model, "prompt")),
            "cached": (self.tokens, (route, host, model, "cached")),
            "completion": (self.tokens, (route, host, model, "completion")),
        }
        series = _Series(route, seen, metrics)
        if model == row.model and len(self._series) < _MAX_SERIES:
            self._series[(row.route, row.host, row.model, row.status)] = series
        return series

    def lease_event(self, event: LeaseEvent) -> None:
        """One saved lease change (a Table listener)."""
        self.lease_events.labels(event.reason).inc()
        if event.from_host and event.to_host and event.model:  # not a pin row
            self.lease_moves.labels(event.reason).inc()

    def model_event(self, event: ModelEvent) -> None:
        """A model load or unload on a router-mode host (a Hosts model listener)."""
        if event.host not in self.config.hosts:
            return
        if event.kind == "load":
            self.model_loads.labels(event.host, event.model, event.reason).inc()
        else:
            reason = "failed" if event.kind == "fail" else event.reason
            self.model_unloads.labels(event.host, event.model, reason).inc()

    def row_labels(self, row: UsageRow) -> tuple[str, str, str]:
        """The bounded (route, host, model) labels of a row, as every series here has them."""
        return self._labels(row)

    def _labels(self, row: UsageRow) -> tuple[str, str, str]:
        config = self.config
        route = route_label(config, row.route)
        host = row.host if row.host in config.hosts else ("" if not row.host else UNKNOWN)
        served = any(self.hosts.model(h, row.model) is not None for h in config.hosts)
        model = row.model if served else ("" if not row.model else UNKNOWN)
        return route, host, model

    def cache_hit_ratios(self) -> dict[str, float]:
        """route label -> cached / prompt tokens over every request seen."""
        return {r: self._cached[r] / p for r, p in self._prompt.items() if p}
