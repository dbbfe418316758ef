"""A real OTLP/HTTP trace receiver on port 0, decoding each export with `opentelemetry-proto`;
it can also hang (take the request, never answer) or fail (answer 503)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from typing import Any

from attrs import define
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from twisted.internet import reactor
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from tests.support.harness import MODEL, until

KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, which) if which else None


@define
class Received:
    """One span as the collector got it: ids in hex, attributes as Python values."""

    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    status: int  # 0 unset, 1 ok, 2 error
    links: list[tuple[str, str]]  # (trace id, span id)
    resource: dict[str, Any]
    start_ns: int
    end_ns: int

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def decode(body: bytes) -> list[Received]:
    """The spans of one ExportTraceServiceRequest."""
    export = ExportTraceServiceRequest()
    export.ParseFromString(body)
    spans = []
    for resource_spans in export.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        for scope in resource_spans.scope_spans:
            for s in scope.spans:
                spans.append(
                    Received(
                        name=s.name,
                        kind=KINDS[s.kind],
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(),
                        attributes={kv.key: _value(kv.value) for kv in s.attributes},
                        status=s.status.code,
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                        resource=resource,
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                    )
                )
    return spans


class Receiver(Resource):
    """POST /v1/traces: `mode` "ok" (decode, keep, answer), "hang" or "fail" (503)."""

    isLeaf = True

    def __init__(self, mode: str = "ok") -> None:
        super().__init__()
        self.mode = mode
        self.spans: list[Received] = []
        self.exports = 0  # requests received, whatever the mode
        self.headers: list[dict[str, str]] = []
        self._hung: list[Any] = []
        self.port: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port.getHost().port}/v1/traces"

    def render_POST(self, request: Any) -> Any:
        self.exports += 1
        fields = request.requestHeaders.getAllRawHeaders()
        self.headers.append({k.decode().lower(): v[-1].decode() for k, v in fields})
        if self.mode == "hang":
            self._hung.append(request)
            return NOT_DONE_YET
        if self.mode == "fail":
            request.setResponseCode(503)
            return b"collector unavailable"
        body = request.content.read()
        if request.getHeader("content-encoding") == "gzip":
            body = gzip.decompress(body)
        self.spans.extend(decode(body))
        request.setHeader("content-type", "application/x-protobuf")
        return ExportTraceServiceResponse().SerializeToString()

    def named(self, name: str) -> list[Received]:
        return [s for s in self.spans if s.name == name]

    def trace(self, trace_id: str) -> list[Received]:
        return [s for s in self.spans if s.trace_id == trace_id]

    async def until(self, predicate: Callable[[list[Received]], bool], flush: Any = None) -> None:
        """Wait for spans that satisfy `predicate`; `flush()` asks crossbar to export now."""

        def arrived() -> bool:
            if flush is not None:
                flush()
            return predicate(self.spans)

        await until(arrived)

    async def stop(self) -> None:
        for request in self._hung:
            if request.channel is not None:
                request.channel.transport.abortConnection()
        await self.port.stopListening()


async def start_receiver(mode: str = "ok") -> Receiver:
    receiver = Receiver(mode)
    receiver.port = reactor.listenTCP(0, Site(receiver), interface="127.0.0.1")
    return receiver


def refusing_endpoint() -> str:
    """An OTLP endpoint nothing listens on: every export is refused."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1/traces"


async def traced_chat(
    crossbar: Any, route: str, messages: list[dict[str, Any]], traceparent: str, **extra: Any
) -> tuple[Any, Any]:
    """One chat turn sent with a caller's `traceparent`: (response, parsed body)."""
    body = {"model": MODEL, "messages": messages, **extra}
    response = await crossbar.client().post(
        crossbar.url(route, "/v1/chat/completions"),
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "traceparent": traceparent},
    )
    return response, json.loads(await response.content())
