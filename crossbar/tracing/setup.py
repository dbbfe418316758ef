"""Tracing built from `[tracing]`: the OTLP exporter, the sampler, the span queue and its metrics.

Imported only when the config asks for tracing, so crossbar without the `otel` extra never
imports OpenTelemetry. crossbar keeps its tracer provider to itself (it never becomes the
process's global one): nothing but crossbar's own spans goes through it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from twisted.logger import Logger

from crossbar import __version__
from crossbar.config import TracingConfig, hide_password
from crossbar.tracing.export import SpanQueue
from crossbar.tracing.spans import Tracing

log = Logger(namespace="crossbar.tracing")


def exporter(settings: TracingConfig) -> SpanExporter:
    """The OTLP span exporter `settings` name (its other options, such as a CA certificate or
    compression, from the `OTEL_EXPORTER_OTLP_*` variables the exporter reads itself)."""
    headers = dict(settings.headers)
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        insecure = urlsplit(settings.endpoint).scheme == "http"
        return OTLPSpanExporter(
            endpoint=settings.endpoint,
            insecure=insecure,
            headers=headers or None,
            timeout=settings.timeout,
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HTTPSpanExporter,
    )

    return HTTPSpanExporter(
        endpoint=settings.endpoint, headers=headers or None, timeout=settings.timeout
    )


def build_tracing(
    settings: TracingConfig,
    clock: Any,
    registry: CollectorRegistry,
    span_exporter: SpanExporter | None = None,
) -> Tracing:
    """crossbar's tracing to `settings.endpoint`, its counts on `registry`. `clock` times the
    spans and hears the exporting thread (`callFromThread`); `span_exporter` replaces OTLP in
    tests."""
    endpoint = hide_password(settings.endpoint)  # a password in the URL stays out of logs

    def state(ok: bool, failed: int) -> None:
        # From the exporting thread: log observers run on the reactor's.
        call = getattr(clock, "callFromThread", None)
        if call is not None:
            call(_tell, ok, failed, endpoint)

    queue = SpanQueue(
        span_exporter if span_exporter is not None else exporter(settings),
        settings.max_queue,
        on_state=state,
    )
    resource = Resource.create(
        {"service.name": settings.service_name, "service.version": __version__}
    )
    sampler = ParentBased(root=TraceIdRatioBased(settings.sample_ratio))
    provider = TracerProvider(resource=resource, sampler=sampler, shutdown_on_exit=False)
    provider.add_span_processor(queue)
    registry.register(_Counts(queue))
    tracer = provider.get_tracer("crossbar", __version__)
    log.info(
        "tracing: spans to {endpoint} over {protocol}, sampled {ratio:.0%}",
        endpoint=endpoint,
        protocol=settings.protocol,
        ratio=settings.sample_ratio,
    )
    return Tracing(tracer, clock, queue, settings.timeout)


def _tell(ok: bool, failed: int, endpoint: str) -> None:
    if ok:
        log.info("tracing: the collector at {endpoint} takes spans again", endpoint=endpoint)
    else:
        log.warn(
            "tracing: the collector at {endpoint} does not take spans ({failed} lost so far); "
            "requests go on, spans queue and then drop",
            endpoint=endpoint,
            failed=failed,
        )


class _Counts:
    """The span queue's counts, read at scrape time."""

    def __init__(self, queue: SpanQueue) -> None:
        self._queue = queue

    def collect(self) -> Iterator[Metric]:
        q = self._queue
        yield CounterMetricFamily(
            "crossbar_trace_spans_exported",
            "Spans the collector took.",
            value=q.exported,
        )
        yield CounterMetricFamily(
            "crossbar_trace_spans_dropped",
            "Spans dropped because the export queue was full (the collector slow or down).",
            value=q.dropped,
        )
        yield CounterMetricFamily(
            "crossbar_trace_spans_failed",
            "Spans of exports the collector refused or did not answer in time.",
            value=q.failed,
        )
        yield GaugeMetricFamily(
            "crossbar_trace_spans_queued",
            "Ended spans waiting for export.",
            value=q.waiting,
        )
