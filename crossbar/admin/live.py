"""What /metrics reads from crossbar's live objects when Prometheus scrapes (metrics.py holds
the counters the usage rows and lease events feed): slots and queues, hosts and leases, router
places, warmth, the store, upstream connections, refused host reports, keys' refusals, batches
(the store's as the batch runner last read them, and this instance's items' outcomes)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from crossbar.admin.labels import host_stands, route_label
from crossbar.batches import BatchRunner
from crossbar.cluster import Instances
from crossbar.config import Config
from crossbar.hosts import Hosts
from crossbar.leases import Table, Warmth
from crossbar.limiter import Limiter
from crossbar.proxy import ContextGuard, UsageRecorder
from crossbar.store import BATCH_STATUSES
from crossbar.tenants import Tenants
from crossbar.wire import Upstream


class Scraped(Protocol):
    """What the live collector reads (metrics.py `Metrics`)."""

    config: Config
    table: Table
    hosts: Hosts
    limiter: Limiter
    guard: ContextGuard
    usage: UsageRecorder | None
    instances: Instances | None
    warmth: Warmth | None
    tenants: Tenants | None
    upstream: Upstream | None
    batches: BatchRunner | None

    def key_label(self, name: str) -> str: ...

    def cache_hit_ratios(self) -> dict[str, float]: ...


def _queued_by_route(config: Config, limiter: Limiter, host: str, model: str) -> dict[str, int]:
    """Waiters of (host, model) by route label; every route or template that may queue there
    has a series (0 when nobody waits), so the series do not come and go with the traffic."""
    counts: dict[str, int] = {}
    served = host in config.hosts and config.hosts[host].model(model) is not None
    if served:
        for name, route in config.routes.items():
            if host in route.hosts and route.queues():
                counts[name] = 0
        for template in config.templates:
            if host in template.route.hosts and template.route.queues():
                counts.setdefault(f"template:{template.name}", 0)
    for name, n in limiter.queued_by_route(host, model).items():
        label = route_label(config, name)
        counts[label] = counts.get(label, 0) + n
    return counts


class Live:
    """A collector reading crossbar's current state at scrape time."""

    def __init__(self, metrics: Scraped) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        """Slots and queues per host and model, then hosts and leases, then cache hits and
        the guard's counters."""
        m = self._metrics
        yield from _slots(m.config, m.hosts, m.limiter)
        yield from _hosts(m.config, m.hosts, m.table)
        yield from _routers(m.config, m.hosts, m.limiter)
        if m.warmth is not None:
            yield from _warmth(m.config, m.warmth)
        ratio = GaugeMetricFamily(
            "crossbar_cache_hit_ratio",
            "Cached prompt tokens / prompt tokens per route, since start.",
            labels=["route"],
        )
        for route, value in sorted(m.cache_hit_ratios().items()):
            ratio.add_metric([route], value)
        yield ratio
        yield CounterMetricFamily(
            "crossbar_guard_exact_counts",
            "Prompts the context guard had the host count exactly.",
            value=m.guard.exact_counts,
        )
        yield CounterMetricFamily(
            "crossbar_guard_refused",
            "Requests the context guard refused (context_length_exceeded).",
            value=m.guard.refused,
        )
        yield from _store(m)
        yield from _refused_reports(m)
        yield from _resumes(m)
        if m.upstream is not None:
            yield from _upstream(m.config, m.upstream)
        if m.tenants is not None:
            yield from _keys(m)
        if m.batches is not None:
            yield from _batches(m.batches)


ITEM_STATES = ("pending", "running", "done", "failed")
OUTCOMES = ("done", "failed", "retried", "lost")  # BatchRunner.outcomes' keys


def _batches(runner: BatchRunner) -> Iterator[Metric]:
    """Every instance's batches by status and the unended ones' items by state, as the runner
    read them from the store at its last tick (none before its first); and what became of
    the items this instance ran."""
    batches = GaugeMetricFamily(
        "crossbar_batches",
        "Batches in the store by status, every instance's (ended ones until batch_retention "
        "prunes them), as of the batch runner's last tick.",
        labels=["status"],
    )
    items = GaugeMetricFamily(
        "crossbar_batch_items",
        "Items of the batches that have not ended, by state, every instance's, as of the "
        "batch runner's last tick.",
        labels=["state"],
    )
    tally = runner.tally
    if tally is not None:
        for status in BATCH_STATUSES:
            batches.add_metric([status], tally.batches.get(status, 0))
        for state in ITEM_STATES:
            items.add_metric([state], tally.items.get(state, 0))
    outcomes = CounterMetricFamily(
        "crossbar_batch_item_outcomes",
        "Batch items this instance ran, by what came of each run: done, failed (its error "
        "line), retried (tried again later); lost: a done or failed result not kept, its "
        "claim having gone to another instance.",
        labels=["outcome"],
    )
    for outcome in OUTCOMES:
        outcomes.add_metric([outcome], runner.outcomes.get(outcome, 0))
    yield from (batches, items, outcomes)


def _keys(m: Scraped) -> Iterator[Metric]:
    """Requests refused because their key was over a limit, by key label and limit."""
    limited = CounterMetricFamily(
        "crossbar_key_limited",
        "Requests refused (429) because their key was over a limit, by key and limit.",
        labels=["key", "limit"],
    )
    assert m.tenants is not None
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for name, by_limit in m.tenants.meter.limited().items():
        for kind, n in by_limit.items():
            counts[(m.key_label(name), kind)] += n
    for labels, n in sorted(counts.items()):
        limited.add_metric(list(labels), n)
    yield limited


def _slots(config: Config, hosts: Hosts, limiter: Limiter) -> Iterator[Metric]:
    counted = {(s.host, s.model): s for s in limiter.snapshot()}
    configured = [(n, m.name) for n in config.hosts for m in hosts.models(n)]
    pairs = configured + sorted(counted.keys() - set(configured))  # + hosts just removed
    pair = ["host", "model"]
    gauges = {
        "in_flight": GaugeMetricFamily(
            "crossbar_in_flight", "Requests being served, per host and model.", labels=pair
        ),
        "queued": GaugeMetricFamily(
            "crossbar_queued",
            "Requests waiting for a slot, per host, model and route (templates folded).",
            labels=[*pair, "route"],
        ),
        "parallel": GaugeMetricFamily(
            "crossbar_slots", "Slots (parallel) per host and model.", labels=pair
        ),
        "prefill_rate": GaugeMetricFamily(
            "crossbar_host_prefill_tokens_per_second",
            "Prompt tokens a second the host prefills for the model, learned from its answers.",
            labels=pair,
        ),
        "decode_rate": GaugeMetricFamily(
            "crossbar_host_decode_tokens_per_second",
            "Output tokens a second one slot writes for the model, learned from its answers.",
            labels=pair,
        ),
        "queued_prefill": GaugeMetricFamily(
            "crossbar_queued_prefill_tokens",
            "Prompt tokens the waiters of a host and model will have it prefill.",
            labels=pair,
        ),
        "expected_wait": GaugeMetricFamily(
            "crossbar_expected_wait_seconds",
            "Seconds until a slot frees for one more request (what runs and waits, at the "
            "host's rates; +Inf while this instance may use none of its slots).",
            labels=pair,
        ),
    }
    by_class = {
        "held": GaugeMetricFamily(
            "crossbar_class_in_flight",
            "Slots held per host, model and request class (interactive, standard, batch).",
            labels=[*pair, "class"],
        ),
        "waiting": GaugeMetricFamily(
            "crossbar_class_queued",
            "Requests waiting for a slot per host, model and request class.",
            labels=[*pair, "class"],
        ),
    }
    gauges["batch_cap"] = GaugeMetricFamily(
        "crossbar_batch_slots",
        "Slots of a host and model batch requests may hold (a route's batch_slots aside).",
        labels=pair,
    )
    counters = {
        "refused": CounterMetricFamily(
            "crossbar_queue_refused", "Requests refused because the queue was full.", labels=pair
        ),
        "timed_out": CounterMetricFamily(
            "crossbar_queue_timeouts", "Requests that waited queue_timeout in vain.", labels=pair
        ),
        "admitted": CounterMetricFamily(
            "crossbar_slots_admitted",
            "Slots granted to queueing requests, at once or after a wait.",
            labels=pair,
        ),
        "tracked_total": CounterMetricFamily(
            "crossbar_tracked",
            "Requests of queue = false routes counted without waiting.",
            labels=pair,
        ),
        "cancelled": CounterMetricFamily(
            "crossbar_queue_cancelled",
            "Waiters that left the queue before a slot (their client went away).",
            labels=pair,
        ),
        "wait_seconds": CounterMetricFamily(
            "crossbar_queue_waited_seconds",
            "Total time admitted requests spent waiting for their slot.",
            labels=pair,
        ),
        "stopped": CounterMetricFamily(
            "crossbar_batch_stopped",
            "Batch requests stopped (and sent again) for a turn (interactive or standard) waiting.",
            labels=pair,
        ),
    }
    for host, model in pairs:
        labels = [host, model]
        gauges["in_flight"].add_metric(labels, limiter.in_flight(host, model))
        for route, n in sorted(_queued_by_route(config, limiter, host, model).items()):
            gauges["queued"].add_metric([*labels, route], n)
        gauges["parallel"].add_metric(labels, hosts.parallel(host, model))
        gauges["prefill_rate"].add_metric(labels, limiter.rates.prefill(host, model))
        gauges["decode_rate"].add_metric(labels, limiter.rates.decode(host, model))
        gauges["queued_prefill"].add_metric(labels, limiter.queued_prefill(host, model))
        gauges["expected_wait"].add_metric(labels, limiter.expected_wait(host, model))
        gauges["batch_cap"].add_metric(labels, limiter.batch_cap(host, model))
        for name, (held, waiting) in limiter.by_class(host, model).items():
            by_class["held"].add_metric([*labels, name], held)
            by_class["waiting"].add_metric([*labels, name], waiting)
        state = counted.get((host, model))
        for name, family in counters.items():
            family.add_metric(labels, getattr(state, name) if state else 0)
    yield from gauges.values()
    yield from by_class.values()
    yield from counters.values()


def _warmth(config: Config, warmth: Warmth) -> Iterator[Metric]:
    """What each host's answers say it kept warm (leases/warmth.py)."""
    host = ["host"]
    evictions = CounterMetricFamily(
        "crossbar_cache_evictions",
        "Reused turns whose host had evicted their conversation's prefix (they paid its "
        "prefill again).",
        labels=host,
    )
    kept = CounterMetricFamily(
        "crossbar_cache_kept_turns",
        "Reused turns whose host still had their conversation's prefix cached.",
        labels=host,
    )
    capacity = GaugeMetricFamily(
        "crossbar_host_warm_capacity_tokens",
        "Tokens a host keeps warm: its cache_tokens, or learned from its evictions.",
        labels=host,
    )
    active = GaugeMetricFamily(
        "crossbar_host_active_tokens",
        "Tokens of the conversations a host served in the last five minutes.",
        labels=host,
    )
    for name in config.hosts:
        status = warmth.status(name)
        evictions.add_metric([name], status["evictions"])
        kept.add_metric([name], status["kept_turns"])
        active.add_metric([name], status["active_tokens"])
        if status["warm_capacity"] is not None:
            capacity.add_metric([name], status["warm_capacity"])
    yield from (evictions, kept, capacity, active)


def _hosts(config: Config, hosts: Hosts, table: Table) -> Iterator[Metric]:
    leases = GaugeMetricFamily(
        "crossbar_leases", "Leases held per host and model.", labels=["host", "model"]
    )
    for name in config.hosts:
        for model in hosts.models(name):
            leases.add_metric([name, model.name], table.count(name, model.name))
    pins = GaugeMetricFamily("crossbar_pins", "Routes pinned to each host.", labels=["host"])
    pinned: dict[str, int] = defaultdict(int)
    for host in table.pins().values():
        pinned[host] += 1
    healthy = GaugeMetricFamily(
        "crossbar_host_healthy", "1 when the host is healthy, else 0.", labels=["host"]
    )
    draining = GaugeMetricFamily(
        "crossbar_host_draining", "1 when the host is draining, else 0.", labels=["host"]
    )
    flips = CounterMetricFamily(
        "crossbar_host_health_flips", "Health changes of each host.", labels=["host"]
    )
    held = GaugeMetricFamily(
        "crossbar_host_held_down",
        "1 while a flapping host is held out of new placements, else 0.",
        labels=["host"],
    )
    counted = hosts.flips
    for name in config.hosts:
        held.add_metric([name], 1 if hosts.held_down(name) else 0)
        pins.add_metric([name], pinned.get(name, 0))
        healthy.add_metric([name], 1 if hosts.healthy(name) else 0)
        draining.add_metric([name], 1 if hosts.draining(name) else 0)
        flips.add_metric([name], counted.get(name, 0))
    yield from (leases, pins, healthy, draining, flips, held)
    yield CounterMetricFamily(
        "crossbar_probe_errors",
        "Bugs caught in health probe rounds (a probe that fails is not one).",
        value=hosts.probe_errors,
    )


def _routers(config: Config, hosts: Hosts, limiter: Limiter) -> Iterator[Metric]:
    """Router-mode hosts: how many models each holds, which are loaded, their load times."""
    places = GaugeMetricFamily(
        "crossbar_host_max_loaded",
        "Models a router-mode host holds at once (max_loaded, its /props, or learned; absent "
        "while unknown).",
        labels=["host"],
    )
    loaded = GaugeMetricFamily(
        "crossbar_model_loaded",
        "1 while a router-mode host has the model loaded or loading, else 0.",
        labels=["host", "model"],
    )
    seconds = GaugeMetricFamily(
        "crossbar_model_load_seconds",
        "Seconds the host takes to load the model: learned from its loads, else the model's "
        "other hosts', else the default.",
        labels=["host", "model"],
    )
    for name in config.hosts:
        residency = hosts.residency(name)
        if residency is None:
            continue
        if residency.capacity is not None:
            places.add_metric([name], residency.capacity)
        running = set(residency.running())
        for model in hosts.models(name):
            loaded.add_metric([name, model.name], 1 if model.name in running else 0)
            seconds.add_metric([name, model.name], limiter.rates.load(name, model.name))
    yield from (places, loaded, seconds)


def _upstream(config: Config, upstream: Upstream) -> Iterator[Metric]:
    """What the pool of connections to the hosts knows of each (wire/pool.py)."""
    host = ["host"]
    unsolicited = CounterMetricFamily(
        "crossbar_upstream_unsolicited",
        "Answers a host sent that no request asked for (a stale second answer): each retired "
        "its connection.",
        labels=host,
    )
    distrusted = GaugeMetricFamily(
        "crossbar_upstream_distrusted",
        "1 while a host's connections are not kept, for an unsolicited answer in the last "
        "10 minutes, else 0.",
        labels=host,
    )
    connections = GaugeMetricFamily(
        "crossbar_upstream_connections",
        "Connections to a host open or opening (idle, busy, connecting), at most "
        "server.upstream_max_connections.",
        labels=host,
    )
    waiting = GaugeMetricFamily(
        "crossbar_upstream_waiting",
        "Requests waiting for a connection to a host to come free (at its bound).",
        labels=host,
    )
    for name, host_config in config.hosts.items():
        counts = upstream.counts(host_config.url)
        unsolicited.add_metric([name], counts.unsolicited)
        distrusted.add_metric([name], 1 if counts.distrusted else 0)
        connections.add_metric([name], counts.open)
        waiting.add_metric([name], counts.waiting)
    yield from (unsolicited, distrusted, connections, waiting)


def _refused_reports(m: Scraped) -> Iterator[Metric]:
    refused = CounterMetricFamily(
        "crossbar_host_reports_refused",
        "Answers whose host reported token counts or times out of bounds, by host and reason: "
        "their counts were not stored, charged or learned.",
        labels=["host", "reason"],
    )
    if m.usage is not None:
        for (host, why), n in sorted(m.usage.refused_reports.items()):
            if host_stands(m.config, host):
                refused.add_metric([host, why], n)
    yield refused


def _resumes(m: Scraped) -> Iterator[Metric]:
    resumes = CounterMetricFamily(
        "crossbar_resumes",
        "Answers whose host failed, by route (templates folded), reason (why it was cut: "
        "closed, reset, idle_timeout, evacuated...; or why it was not continued) and outcome "
        "(resumed, failed, refused).",
        labels=["route", "reason", "outcome"],
    )
    if m.usage is not None:
        folded: dict[tuple[str, str, str], int] = defaultdict(int)
        for (route, reason, outcome), n in m.usage.resumes.items():
            folded[(route_label(m.config, route), reason, outcome)] += n
        for labels, n in sorted(folded.items()):
            resumes.add_metric(list(labels), n)
    yield resumes


def _store(m: Scraped) -> Iterator[Metric]:
    journal = m.table.journal
    yield GaugeMetricFamily(
        "crossbar_store_degraded",
        "1 while the store cannot be written (routing goes on from memory), else 0.",
        value=1 if journal.degraded else 0,
    )
    unsaved = GaugeMetricFamily(
        "crossbar_store_unsaved",
        "What waits in memory for the store: leases, lease events, usage rows.",
        labels=["kind"],
    )
    status = journal.status()
    unsaved.add_metric(["leases"], status["unsaved_leases"])
    unsaved.add_metric(["events"], status["unsaved_events"])
    unsaved.add_metric(["usage"], len(m.usage.unsaved) if m.usage is not None else 0)
    yield unsaved
    if m.instances is not None:
        yield GaugeMetricFamily(
            "crossbar_instances",
            "Live crossbar instances sharing this one's store (this one included).",
            value=len(m.instances.live),
        )
        yield GaugeMetricFamily(
            "crossbar_config_mismatch",
            "Live instances whose config digest differs from this one's.",
            value=len(m.instances.mismatched),
        )
