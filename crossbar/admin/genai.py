"""The GenAI conventions' client metrics on `/metrics`, when tracing is on
(docs/reference.md, "Metrics"): `gen_ai.client.token.usage` and
`gen_ai.client.operation.duration`, as Prometheus histograms beside crossbar's own, their
labels bounded as theirs are (labels.py).

crossbar is the GenAI client of its hosts: each inference request it forwards is one operation,
timed from its arrival to the end of its answer. Prewarms are crossbar's own work, left out as
they are from `crossbar_tokens_total`.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Histogram

from crossbar.admin.labels import Seen, host_stands, label_stands
from crossbar.admin.metrics import Metrics
from crossbar.config import Config
from crossbar.records import UsageRow
from crossbar.tracing import operation

# The conventions' advised bucket boundaries.
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48)
DURATION_BUCKETS += (40.96, 81.92)
_KEPT = 10_000  # rows' label sets kept worked out, at most


class GenAIMetrics:
    """Hears usage rows (a UsageRecorder observer); its histograms are on `metrics`' registry."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        labels = ["gen_ai_operation_name", "gen_ai_request_model", "route", "host"]
        self.tokens = Histogram(
            "gen_ai_client_token_usage",
            "Tokens per GenAI operation, by gen_ai_token_type: input (the whole prompt, cached "
            "included) and output.",
            [*labels, "gen_ai_token_type"],
            buckets=TOKEN_BUCKETS,
            registry=metrics.registry,
        )
        self.duration = Histogram(
            "gen_ai_client_operation_duration_seconds",
            "Seconds from a GenAI operation's arrival to the end of its answer; error_type is "
            "its HTTP status when it failed, else empty.",
            [*labels, "error_type"],
            buckets=DURATION_BUCKETS,
            registry=metrics.registry,
        )
        self._seen = Seen()
        self._children: dict[tuple[Any, ...], tuple[Any, Any, Any]] = {}

    def reconfigure(self, config: Config) -> None:
        """Drop the series of routes and hosts the reloaded config no longer has."""
        self._children.clear()

        def stale(values: tuple[str, ...]) -> bool:
            route, host = values[2], values[3]
            return not (label_stands(config, route) and host_stands(config, host))

        self._seen.forget_stale(stale)

    def observe(self, row: UsageRow) -> None:
        """One finished request: an inference operation counts its tokens and its time."""
        if row.lease == "prewarm" or not row.host:
            return  # crossbar's own work, or refused before any host was chosen
        op = operation(row.path)
        if op is None:
            return
        error = str(row.status) if row.status >= 400 else ("incomplete" if row.error else "")
        key = (row.route, row.host, row.model, op, error)
        children = self._children.get(key)
        if children is None:
            children = self._made(row, op, error)
            if len(self._children) < _KEPT:
                self._children[key] = children
        input_tokens, output_tokens, duration = children
        if row.prompt_tokens:
            input_tokens.observe(row.prompt_tokens)
        if row.completion_tokens:
            output_tokens.observe(row.completion_tokens)
        duration.observe(row.duration_ms / 1000)

    def _made(self, row: UsageRow, op: str, error: str) -> tuple[Any, Any, Any]:
        route, host, model = self._metrics.row_labels(row)
        base = (op, model, route, host)
        seen = self._seen
        return (
            seen.labels(self.tokens, *base, "input"),
            seen.labels(self.tokens, *base, "output"),
            seen.labels(self.duration, *base, error),
        )
