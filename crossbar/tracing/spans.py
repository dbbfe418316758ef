"""crossbar's spans (docs/operator-guide.md, "Tracing").

One SERVER span per client request, the child of the client's W3C `traceparent` when it sent
one (else a new trace, sampled by the ratio); under it what crossbar decided and waited for:
`crossbar.lease`, `crossbar.guard` (only when the host counted the prompt), `crossbar.queue`,
and one CLIENT span per upstream attempt, named `{operation} {model}` with the GenAI
conventions' attributes. The request to the host carries a `traceparent` whose parent is that
CLIENT span. A move crossbar makes itself (evacuate, rebalance) is a trace of its own:
`crossbar.move` linked to the conversation's last turn, its prewarm a CLIENT span under it.

Spans are timed by the injected clock and passed explicitly (never through a context
variable): a request's steps run in one coroutine, and what a span's parent is stays visible
in the code.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from attrs import evolve
from opentelemetry.context import Context
from opentelemetry.trace import (
    Link,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from twisted.internet.defer import Deferred

from crossbar.config import HostConfig
from crossbar.tracing import genai
from crossbar.tracing.export import SpanQueue
from crossbar.wire import Exchange, Inbound, Outgoing

_PROPAGATOR = TraceContextTextMapPropagator()
# W3C Trace Context's tracestate list-member (a key, "=", a value), and the bounds of the list.
_MEMBER = re.compile(
    rb"(?:[a-z][a-z0-9_*/-]{0,255}|[a-z0-9][a-z0-9_*/-]{0,240}@[a-z][a-z0-9_*/-]{0,13})"
    rb"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
_MAX_MEMBERS = 32
_MAX_TRACESTATE = 8192  # the propagator's own bound (W3C asks at least 512 be kept)
_MAX_TRACEPARENT = 512  # the propagator's own bound, past which it logs a warning
_TRACE_HEADERS = frozenset({b"traceparent", b"tracestate"})
_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
)
_ERROR = Status(StatusCode.ERROR)
_ROOT = Context()  # the parent of a new trace


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def well_formed_tracestate(values: list[bytes]) -> bool:
    """Whether a request's `tracestate` lines make a list W3C Trace Context allows. One that
    does not is dropped without a word, as the recommendation says: the propagator would log
    the client's text at each request (no key needed to send it), and a trace goes on
    without its vendors' state."""
    if sum(len(v) for v in values) + len(values) - 1 > _MAX_TRACESTATE:
        return False
    keys: set[bytes] = set()
    for value in values:
        for member in value.split(b","):
            member = member.strip(b" \t")
            if not member:
                continue
            if _MEMBER.fullmatch(member) is None:
                return False
            key = member.partition(b"=")[0]
            if key in keys:
                return False
            keys.add(key)
    return len(keys) <= _MAX_MEMBERS


class Tracing:
    """crossbar's tracer: spans timed by `clock`, ended spans to `queue` (export.py)."""

    def __init__(self, tracer: Tracer, clock: Any, queue: SpanQueue, timeout: float) -> None:
        self._tracer = tracer
        self._clock = clock
        self.queue = queue
        self._timeout = timeout

    # -- spans in general

    def start(
        self,
        name: str,
        parent: Context | None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: dict[str, Any] | None = None,
        links: list[Link] | None = None,
        at: float | None = None,
    ) -> Span:
        """A span under `parent` (None: a new trace), started now or `at` (clock seconds)."""
        start = _ns(self._clock.seconds() if at is None else at)
        # An empty context, never the ambient one: what a span's parent is stays explicit.
        context = parent if parent is not None else _ROOT
        return self._tracer.start_span(
            name, context, kind, attributes, links or (), start, record_exception=False
        )

    def end(self, span: Span, attributes: dict[str, Any] | None = None, error: str = "") -> None:
        """End `span` now with `attributes`; `error` (its error.type) marks it failed."""
        if span.is_recording():
            if attributes:
                span.set_attributes(attributes)
            if error:
                span.set_attribute("error.type", error)
                span.set_status(_ERROR)
        span.end(_ns(self._clock.seconds()))

    # -- a client request

    def request(self, request: Any, started: float) -> RequestTrace:
        """The SERVER span of one client request, begun when it arrived (`started`)."""
        headers = request.requestHeaders
        parent = None
        values = headers.getRawHeaders(b"traceparent")
        if values and len(values[0]) <= _MAX_TRACEPARENT:
            carrier = {"traceparent": [v.decode("latin-1") for v in values]}
            state = headers.getRawHeaders(b"tracestate")
            if state and well_formed_tracestate(state):
                carrier["tracestate"] = [v.decode("latin-1") for v in state]
            parent = _PROPAGATOR.extract(carrier)
        method = request.method.decode("ascii", "replace")
        method = method if method in _METHODS else "_OTHER"
        attributes: dict[str, Any] = {
            "http.request.method": method,
            "url.path": request.path.decode("utf-8", "replace"),
            "url.scheme": "https" if request.isSecure() else "http",
        }
        peer = getattr(request.getClientAddress(), "host", None)
        if peer:
            attributes["client.address"] = peer
        name = "HTTP" if method == "_OTHER" else method
        span = self.start(name, parent, SpanKind.SERVER, attributes, at=started)
        return RequestTrace(self, span, method)

    def inject(self, out: Outgoing, span: Span) -> Outgoing:
        """`out` with a `traceparent` (and `tracestate`) naming `span` as the parent, in place
        of any the client sent."""
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, set_span_in_context(span))
        if not carrier:
            return out
        headers = [(k, v) for k, v in out.headers if k.lower() not in _TRACE_HEADERS]
        headers += [(k.encode(), v.encode("latin-1")) for k, v in carrier.items()]
        return evolve(out, headers=headers)

    def headers(self, span: Span) -> list[tuple[bytes, bytes]]:
        """The trace headers naming `span` as the parent (for crossbar's own calls)."""
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, set_span_in_context(span))
        return [(k.encode(), v.encode("latin-1")) for k, v in carrier.items()]

    def upstream(
        self,
        parent: Context | None,
        inbound: Inbound,
        model: str,
        fp: str,
        host: HostConfig,
        upstream_model: str,
        record_content: bool,
        links: list[Link] | None = None,
    ) -> Span:
        """The CLIENT span of one attempt at a host: `{operation} {model}` for inference (the
        GenAI attributes), `{method}` for any other call."""
        operation = genai.operation(inbound.path) if inbound.method == "POST" else None
        url = urlsplit(host.url)
        attributes: dict[str, Any] = {
            "server.address": url.hostname or "",
            "server.port": url.port or (443 if url.scheme == "https" else 80),
            "http.request.method": inbound.method,
            "url.path": inbound.path,
            "crossbar.host": host.name,
        }
        if operation is None:
            return self.start(inbound.method, parent, SpanKind.CLIENT, attributes, links)
        attributes.update(
            {
                "gen_ai.operation.name": operation,
                "gen_ai.provider.name": genai.PROVIDER,
                "gen_ai.request.model": model,
                "crossbar.upstream.model": upstream_model,
            }
        )
        if fp:
            attributes["gen_ai.conversation.id"] = fp
        attributes.update(genai.request_parameters(inbound.body))
        if record_content:
            attributes.update(genai.input_contents(inbound.body))
        return self.start(f"{operation} {model}", parent, SpanKind.CLIENT, attributes, links)

    def answered(
        self,
        span: Span,
        ex: Exchange,
        sent: float,
        answer: bytes | None = None,
        cut: str | None = None,
    ) -> None:
        """End an upstream attempt's span once its answer was relayed (or `cut`: why it
        ended early, "" when it did not; None: what `ex.error` says)."""
        if not span.is_recording():
            span.end(_ns(self._clock.seconds()))
            return
        tokens = ex.tokens
        attributes: dict[str, Any] = {
            "http.response.status_code": ex.status,
            "crossbar.stream": ex.stream,
        }
        if tokens.prompt or tokens.completion:
            attributes["gen_ai.usage.input_tokens"] = tokens.prompt
            attributes["gen_ai.usage.cache_read.input_tokens"] = tokens.cached
            attributes["gen_ai.usage.output_tokens"] = tokens.completion
        if ex.stream and ex.first_byte is not None:
            attributes["gen_ai.response.time_to_first_chunk"] = max(0.0, ex.first_byte - sent)
        if answer:
            attributes.update(genai.output_contents(answer, ex.stream))
        error = ""
        why = ex.error if cut is None else cut  # an earlier attempt's failure is not this one's
        if ex.status >= 400:
            error = str(ex.status)
        elif why:
            error = _error_type(why)
        self.end(span, attributes, error)

    # -- crossbar's own moves

    def move(
        self, route: str, fp: str, model: str, origin: str, host: str, reason: str,
        turn: SpanContext | None,
    ) -> Span:  # fmt: skip
        """The span of one warm hand-off (a trace of its own), linked to the conversation's last
        turn when one is known."""
        links = [Link(turn, {"crossbar.link": "last turn"})] if turn is not None else None
        attributes: dict[str, Any] = {
            "crossbar.move.reason": reason,
            "crossbar.route": route,
            "gen_ai.request.model": model,
            "crossbar.move.from": origin,
            "crossbar.host": host,
        }
        if fp:
            attributes["gen_ai.conversation.id"] = fp
        return self.start("crossbar.move", None, SpanKind.INTERNAL, attributes, links)

    def prewarm(
        self, parent: Span, path: str, body: Any, fp: str, model: str, host: HostConfig,
        upstream_model: str,
    ) -> Span:  # fmt: skip
        """The CLIENT span of a prewarm under its move's span."""
        inbound = Inbound("POST", path, "", b"", body, None, "", False)
        span = self.upstream(
            set_span_in_context(parent), inbound, model, fp, host, upstream_model, False
        )
        if span.is_recording():
            span.set_attribute("crossbar.prewarm", True)
        return span

    # -- the end

    def close(self) -> Deferred[None]:
        """Export what waits and stop the exporting thread: fires once it has, or after the
        export timeout (a hung collector must not hold a stop)."""
        d: Deferred[None] = Deferred()
        call = getattr(self._clock, "callFromThread", None)

        def done() -> None:
            if call is not None:
                call(_fire, d)

        self.queue.close(done)
        if call is None:
            d.callback(None)
            return d
        return d.addTimeout(self._timeout + 1, self._clock, onTimeoutCancel=lambda *_: None)


def _fire(d: Deferred[None]) -> None:
    if not d.called:
        d.callback(None)


def _error_type(error: str) -> str:
    """A bounded error.type from what an exchange says went wrong."""
    if error.startswith("upstream "):
        return error[len("upstream ") :].replace(" ", "_")
    return {
        "client disconnected": "cancelled",
        "shutdown": "shutdown",
        "client stopped reading": "client_stalled",
    }.get(error, "_OTHER")


class RequestTrace:
    """One client request's spans: the SERVER span, and the upstream attempt under way."""

    __slots__ = ("_method", "_tracing", "client", "context", "sent", "span")

    def __init__(self, tracing: Tracing, span: Span, method: str) -> None:
        self._tracing = tracing
        self._method = method
        self.span = span
        self.context = set_span_in_context(span)
        self.client: Span | None = None  # the upstream attempt's CLIENT span
        self.sent = 0.0  # when that attempt began

    @property
    def tracing(self) -> Tracing:
        """The tracer the request's spans come from."""
        return self._tracing

    def routed(self, route: str, template: str | None) -> None:
        """The request's route is known, and its `http.route` template when its path is one
        crossbar serves."""
        span = self.span
        if not span.is_recording():
            return
        span.set_attribute("crossbar.route", route)
        if template is not None:
            span.set_attribute("http.route", template)
            if self._method != "_OTHER":
                span.update_name(f"{self._method} {template}")

    def fell_back(self, route: str, reason: str) -> None:
        """The request's route could not serve it (`reason`): fallback `route` is tried."""
        span = self.span
        if span.is_recording():
            span.set_attribute("crossbar.fallback.route", route)
            span.set_attribute("crossbar.fallback.reason", reason)

    def resumed(self, host: str, cause: str, sent: int) -> None:
        """The answer was cut on `host` (`cause`) after `sent` tokens: it goes on elsewhere
        (proxy/resume.py); an event on the request's span, one per move."""
        span = self.span
        if span.is_recording():
            attributes = {"crossbar.host": host, "crossbar.resume.cause": cause}
            span.add_event("crossbar.resume", {**attributes, "crossbar.resume.sent": sent})

    def start(self, name: str, attributes: dict[str, Any] | None = None) -> Span:
        """A step's span under the SERVER span."""
        return self._tracing.start(name, self.context, SpanKind.INTERNAL, attributes)

    def end(self, span: Span, attributes: dict[str, Any] | None = None, error: str = "") -> None:
        self._tracing.end(span, attributes, error)

    def attempt(
        self, inbound: Inbound, model: str, fp: str, host: HostConfig, upstream_model: str,
        record_content: bool,
    ) -> Span:  # fmt: skip
        """The CLIENT span of an attempt at `host`, begun now."""
        tracing = self._tracing
        self.sent = tracing._clock.seconds()
        span = tracing.upstream(
            self.context, inbound, model, fp, host, upstream_model, record_content
        )
        self.client = span
        return span

    def response_id(self, id_: str) -> None:
        """The host's completion id, on the attempt that answered."""
        if self.client is not None and self.client.is_recording():
            self.client.set_attribute("gen_ai.response.id", id_)

    def failed(self, error: str, status: int = 0) -> None:
        """The attempt under way got no answer (`error`: its error.type)."""
        span, self.client = self.client, None
        if span is not None:
            attributes = {"http.response.status_code": status} if status else None
            self._tracing.end(span, attributes, error)

    def answered(self, ex: Exchange, answer: bytes | None, cut: str) -> None:
        """The attempt under way was relayed, whole or `cut` (why: "" when it was not)."""
        span, self.client = self.client, None
        if span is not None:
            self._tracing.answered(span, ex, self.sent, answer, cut)

    def finish(self, ex: Exchange, status: int) -> None:
        """End the SERVER span: the answer's status, the host and lease that served it."""
        span = self.span
        if self.client is not None:  # cancelled mid-attempt
            self.failed(_error_type(ex.error or "client disconnected"))
        if not span.is_recording():
            span.end(_ns(self._tracing._clock.seconds()))
            return
        attributes: dict[str, Any] = {"http.response.status_code": status}
        if ex.host:
            attributes["crossbar.host"] = ex.host
        if ex.lease:
            attributes["crossbar.lease"] = ex.lease
        if ex.model:
            attributes["gen_ai.request.model"] = ex.model
        if ex.fp:
            attributes["gen_ai.conversation.id"] = ex.fp
        if ex.error:
            attributes["crossbar.error"] = ex.error[:256]
        # A server span fails on 5xx only: a 4xx is the client's (HTTP conventions).
        self._tracing.end(span, attributes, str(status) if status >= 500 else "")
