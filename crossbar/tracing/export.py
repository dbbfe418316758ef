"""Ended spans to the collector: a bounded queue, emptied in batches by a thread of its own.

The reactor thread only appends an ended span to a deque (or counts it dropped when the queue
is full): it never waits for the collector, encodes a span or takes a lock the exporting
thread holds while it exports. The thread wakes when a batch is full or every `delay`
seconds, and hands each batch to the OTLP exporter, which waits at most its `timeout` for the
collector. A collector that is down, slow or refusing only fills the queue; past `max_queue`
ended spans are dropped, and counted.

The SDK's own BatchSpanProcessor does the same with the same thread, but drops silently (one
log line); crossbar counts every drop for `/metrics`, hence this one.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

BATCH = 512  # spans per export at most (the SDK's default)
DELAY = 1.0  # seconds between exports while fewer than a batch wait


class SpanQueue(SpanProcessor):
    """A span processor exporting sampled spans in batches from its own thread.

    Counts (read from any thread; written by one each): `dropped` (the queue was full),
    `exported`, `failed` (spans of exports the collector did not take), `waiting` (queued now).
    `on_state(ok)` is called from the exporting thread when exports start or stop failing."""

    def __init__(
        self,
        exporter: SpanExporter,
        max_queue: int,
        batch: int = BATCH,
        delay: float = DELAY,
        on_state: Callable[[bool, int], None] | None = None,
    ) -> None:
        self._exporter = exporter
        self._max_queue = max_queue
        self._batch = batch
        self._delay = delay
        self._on_state = on_state
        self._queue: deque[ReadableSpan] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._done_callbacks: list[Callable[[], None]] = []
        self.dropped = 0
        self.exported = 0
        self.failed = 0
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="crossbar-traces", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    # -- the reactor's side

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        context = span.context
        if context is None or not context.trace_flags.sampled:
            return
        queue = self._queue
        if len(queue) >= self._max_queue or self._stopping:
            self.dropped += 1
            return
        queue.append(span)  # deque.append is atomic: no lock shared with the exporter
        if len(queue) >= self._batch:
            self._wake.set()

    def flush(self) -> None:
        """Export what waits now, not at the next tick (never waits for it)."""
        self._wake.set()

    def close(self, done: Callable[[], None]) -> None:
        """Export what waits, stop the thread and the exporter; `done` is called from the
        exporting thread once it has (the caller bounds how long it waits for that)."""
        self._done_callbacks.append(done)
        self._stopping = True
        self._wake.set()

    def shutdown(self) -> None:
        """The provider's shutdown: stop without waiting for the thread."""
        self._stopping = True
        self._wake.set()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # never blocks its caller: the thread exports on its own

    # -- the exporting thread

    def _run(self) -> None:
        while True:
            self._wake.wait(self._delay)
            self._wake.clear()
            self._export_waiting()
            if self._stopping:
                break
        try:
            self._exporter.shutdown()
        except Exception:
            pass  # stopping anyway; nothing would read an error here
        for done in self._done_callbacks:
            done()

    def _export_waiting(self) -> None:
        queue = self._queue
        while queue:
            batch: list[Any] = []
            while queue and len(batch) < self._batch:
                batch.append(queue.popleft())
            try:
                ok = self._exporter.export(batch) is SpanExportResult.SUCCESS
            except Exception:
                ok = False  # an exporter bug must not end the thread
            if ok:
                self.exported += len(batch)
            else:
                self.failed += len(batch)
            if ok == self._failing:  # the state changed
                self._failing = not ok
                if self._on_state is not None:
                    self._on_state(ok, self.failed)
