"""The span queue between the reactor and the collector: ending a span never waits for an
export, a full queue drops (and counts) rather than grows, and what waits is exported in
batches once the exporter is free again."""

from __future__ import annotations

import threading

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from crossbar.tracing.export import SpanQueue

WAIT = 10  # seconds any cross-thread wait may take before the test fails


class Gated(SpanExporter):
    """An exporter stuck (like a hung collector) until `release` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.batches: list[int] = []
        self.shut = False

    def export(self, spans):
        self.entered.set()
        assert self.release.wait(WAIT)
        self.batches.append(len(spans))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shut = True


def ended(provider: TracerProvider, n: int) -> None:
    tracer = provider.get_tracer("test")
    for i in range(n):
        tracer.start_span(f"s{i}").end()


def test_a_stuck_exporter_never_holds_a_span_end_and_a_full_queue_drops_counted():
    exporter = Gated()
    queue = SpanQueue(exporter, max_queue=10, batch=4, delay=60)
    provider = TracerProvider()
    provider.add_span_processor(queue)
    ended(provider, 4)  # a full batch wakes the thread, which gets stuck exporting it
    assert exporter.entered.wait(WAIT)
    ended(provider, 15)  # while it is stuck: 10 fit, 5 do not
    assert (queue.waiting, queue.dropped) == (10, 5)
    closed = threading.Event()
    queue.close(closed.set)
    ended(provider, 1)  # after close: nothing more is taken
    assert queue.dropped == 6
    exporter.release.set()
    assert closed.wait(WAIT)
    assert exporter.batches == [4, 4, 4, 2]  # what waited went out in batches before the stop
    assert (queue.exported, queue.failed, queue.waiting) == (14, 0, 0)
    assert exporter.shut


class Refusing(SpanExporter):
    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans):
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("refused")  # an exporter that raises counts as a failure
        return SpanExportResult.FAILURE


def test_failed_exports_are_counted_and_reported_once_per_change():
    states: list[tuple[bool, int]] = []
    reported = threading.Event()
    exporter = Refusing()

    def state(ok: bool, failed: int) -> None:
        states.append((ok, failed))
        reported.set()

    queue = SpanQueue(exporter, max_queue=10, batch=2, delay=60, on_state=state)
    provider = TracerProvider()
    provider.add_span_processor(queue)
    ended(provider, 2)
    assert reported.wait(WAIT)
    closed = threading.Event()
    ended(provider, 2)
    queue.close(closed.set)
    assert closed.wait(WAIT)
    assert queue.failed == 4 and queue.exported == 0
    assert states == [(False, 2)]  # the second failure is no news


def test_spans_not_sampled_never_reach_the_queue():
    queue = SpanQueue(Gated(), max_queue=10)
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(queue)
    ended(provider, 3)
    assert (queue.waiting, queue.dropped) == (0, 0)
    closed = threading.Event()
    queue.close(closed.set)
    assert closed.wait(WAIT)
