"""`protocol = "grpc"`: the same spans reach a real OTLP/gRPC receiver (the collector's
TraceService from `opentelemetry-proto`, on port 0), with the configured headers as metadata."""

from __future__ import annotations

from concurrent import futures
from typing import Any

import grpc
import pytest_twisted
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.support.harness import MODEL, start_crossbar, start_fakes, until, wait
from tests.support.otlp import Received, decode, traced_chat

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every export's spans and metadata (from gRPC's threads)."""

    def __init__(self) -> None:
        self.spans: list[Received] = []
        self.metadata: list[dict[str, str]] = []

    def Export(self, request: Any, context: Any) -> Any:
        self.metadata.append(dict(context.invocation_metadata()))
        self.spans.extend(decode(request.SerializeToString()))
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest_twisted.ensureDeferred
async def test_spans_go_to_a_grpc_collector_with_the_headers_as_metadata():
    collector = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    fakes = await start_fakes("titan")
    tracing = {
        "endpoint": f"http://127.0.0.1:{port}",
        "protocol": "grpc",
        "headers": {"x-team": "infra"},
    }
    crossbar = await start_crossbar(
        fakes, {"convo": {"hosts": ["titan"], "default_model": MODEL}}, tracing=tracing
    )
    queue = crossbar.parts.tracing.queue
    try:
        messages = [{"role": "user", "content": "Hello over gRPC."}]
        caller = f"00-{TRACE}-{PARENT}-01"
        response, _ = await wait(traced_chat(crossbar, "convo", messages, caller, max_tokens=4))
        assert response.code == 200

        def arrived() -> bool:
            queue.flush()
            return len([s for s in collector.spans if s.trace_id == TRACE]) >= 4

        await until(arrived)
    finally:
        await crossbar.stop()
        server.stop(grace=None)
    spans = [s for s in collector.spans if s.trace_id == TRACE]
    server_span = next(s for s in spans if s.kind == "SERVER")
    assert server_span.parent_id == PARENT
    assert {s.name for s in spans} >= {"crossbar.lease", f"chat {MODEL}"}
    assert collector.metadata[0]["x-team"] == "infra"
