"""A client's W3C trace context is read as the recommendation says: a well-formed `tracestate`
goes with its `traceparent`, and a malformed one is dropped without a log line (any client
may send one, with no key, on every request), the trace going on under its parent."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock

from crossbar.tracing.export import SpanQueue
from crossbar.tracing.spans import Tracing
from crossbar.wire import RawHeaders

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


class _Nowhere(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS


class _Request:
    method = b"POST"
    path = b"/r/convo/v1/chat/completions"

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.requestHeaders = RawHeaders(headers)

    def isSecure(self) -> bool:
        return False

    def getClientAddress(self):
        return IPv4Address("TCP", "10.0.0.9", 40000)


def parent_of(state: bytes):
    headers = [(b"traceparent", f"00-{TRACE}-{PARENT}-01".encode()), (b"tracestate", state)]
    provider = TracerProvider(shutdown_on_exit=False)
    spans = SpanQueue(_Nowhere(), 10)
    try:
        tracing = Tracing(provider.get_tracer("test"), Clock(), spans, 5.0)
        return tracing.request(_Request(headers), 0.0).span.parent
    finally:
        spans.shutdown()  # its exporting thread ends with the test (others count them)
        spans._thread.join()


@pytest.mark.parametrize(
    "state",
    [
        b"not a tracestate " * 100,  # 1.7 KB of the client's text
        b"UPPER=case",
        b"k=v,k=again",  # a key twice
        b"k=" + b"v" * 300,
        b",".join(b"k%d=v" % i for i in range(33)),
    ],
)
def test_a_malformed_tracestate_is_dropped_silently_and_the_parent_kept(state, caplog):
    with caplog.at_level(logging.DEBUG):
        parent = parent_of(state)
    assert [r.getMessage() for r in caplog.records] == []
    assert format(parent.trace_id, "032x") == TRACE and format(parent.span_id, "016x") == PARENT
    assert not parent.trace_state


def test_a_well_formed_tracestate_goes_with_its_parent(caplog):
    with caplog.at_level(logging.DEBUG):
        parent = parent_of(b"rojo=00f067aa0ba902b7, congo=t61rcWkgMzE ,, tenant@sys=a b")
    assert caplog.records == []
    assert dict(parent.trace_state) == {
        "rojo": "00f067aa0ba902b7",
        "congo": "t61rcWkgMzE",
        "tenant@sys": "a b",
    }
