"""Traces, end to end: the official clients talk to crossbar (real sockets, port 0) in front
of the fake llama-server, and crossbar exports its spans to a real OTLP/HTTP receiver, which
decodes them with `opentelemetry-proto`.

A turn is a SERVER span (the child of the client's `traceparent` when it sent one) with the
lease, queue and upstream CLIENT spans under it; the CLIENT span carries the GenAI attributes
and is the parent of the `traceparent` the host receives. A collector that hangs or refuses
changes no answer. Message contents appear only on a route that opts in.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import anthropic
import openai
import pytest_twisted
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import defer
from twisted.internet.threads import deferToThread

from crossbar.admin import GenAIMetrics
from tests.support.harness import MODEL, Crossbar, start_crossbar, start_fakes, until, wait
from tests.support.otlp import Received, Receiver, refusing_endpoint, start_receiver

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"  # the caller's trace (W3C's own example ids)
PARENT = "00f067aa0ba902b7"  # the caller's span
ROUTES = {
    "convo": {"hosts": ["titan"], "default_model": MODEL, "aliases": {"claude-*": MODEL}},
    "open": {"hosts": ["titan"], "default_model": MODEL, "record_content": True},
}
HELLO = [
    {"role": "system", "content": "You review code."},
    {"role": "user", "content": "Refactor the parser, please."},
]


async def traced(receiver: Receiver, **tracing: Any) -> Crossbar:
    fakes = await start_fakes("titan")
    return await start_crossbar(fakes, ROUTES, tracing={"endpoint": receiver.endpoint, **tracing})


def client(crossbar: Crossbar, route: str = "convo") -> openai.OpenAI:
    return openai.OpenAI(base_url=crossbar.url(route, "/v1"), api_key="none", max_retries=0)


async def in_thread(call: Any) -> Any:
    """Run a blocking client call while the reactor serves crossbar."""
    return await wait(deferToThread(call), 60)


def chat(crossbar: Crossbar, route: str = "convo", traceparent: str | None = None, **extra):
    headers = {"traceparent": traceparent} if traceparent else None

    def call() -> Any:
        with client(crossbar, route) as c:
            return c.chat.completions.create(
                model=MODEL, messages=extra.pop("messages", HELLO), max_tokens=8,
                extra_headers=headers, **extra,
            )  # fmt: skip

    return call


async def spans_of(receiver: Receiver, crossbar: Crossbar, trace_id: str, n: int) -> list[Received]:
    """The `n` spans of trace `trace_id`, once the receiver has them all."""
    queue = crossbar.parts.tracing.queue
    await receiver.until(lambda _: len(receiver.trace(trace_id)) >= n, flush=queue.flush)
    return receiver.trace(trace_id)


def one(spans: list[Received], name: str) -> Received:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def context_of(traceparent: str) -> tuple[str, str, bool]:
    """(trace id, parent span id, sampled) of a W3C traceparent (other flags aside)."""
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00"
    return trace_id, span_id, bool(int(flags, 16) & 1)


def upstream_traceparents(crossbar: Crossbar, path: str, host: str = "titan") -> list[str]:
    """The traceparents `host` (a fake) was sent on `path`, oldest first."""
    seen = crossbar.fakes[host].counters.seen
    return [
        values[-1].decode()
        for p, headers in seen
        if p == path
        for values in [headers.getRawHeaders(b"traceparent")]
        if values
    ]


@pytest_twisted.async_yield_fixture
async def receiver():
    running = await start_receiver()
    yield running
    await running.stop()


@pytest_twisted.ensureDeferred
async def test_a_json_turn_is_a_server_span_under_the_callers_trace_with_its_steps_under_it(
    receiver,
):
    crossbar = await traced(receiver)
    try:
        answer = await in_thread(chat(crossbar, traceparent=f"00-{TRACE}-{PARENT}-01"))
        spans = await spans_of(receiver, crossbar, TRACE, 4)
    finally:
        await crossbar.stop()

    server = one(spans, "POST /r/{route}/v1/chat/completions")
    assert (server.kind, server.parent_id) == ("SERVER", PARENT)
    assert server.attributes["http.request.method"] == "POST"
    assert server.attributes["http.route"] == "/r/{route}/v1/chat/completions"
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["crossbar.route"] == "convo"
    assert server.attributes["crossbar.host"] == "titan"
    assert server.resource["service.name"] == "crossbar"

    lease = one(spans, "crossbar.lease")
    assert lease.parent_id == server.span_id
    assert lease.attributes["crossbar.lease"] == "new"
    assert lease.attributes["crossbar.lease.reason"] == "chosen"
    assert lease.attributes["crossbar.host"] == "titan"
    fp = crossbar.parts.table.snapshot()[0].key.fp
    assert lease.attributes["gen_ai.conversation.id"] == fp

    queue = one(spans, "crossbar.queue")
    assert queue.parent_id == server.span_id
    assert queue.attributes["crossbar.route"] == "convo"
    assert queue.attributes["crossbar.queue.position"] == 0  # a slot was free
    assert queue.attributes["crossbar.queue.wait_ms"] >= 0

    attempt = one(spans, f"chat {MODEL}")
    assert (attempt.kind, attempt.parent_id) == ("CLIENT", server.span_id)
    a = attempt.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == MODEL
    assert a["gen_ai.conversation.id"] == fp
    assert a["gen_ai.usage.input_tokens"] == answer.usage.prompt_tokens > 0
    assert a["gen_ai.usage.output_tokens"] == answer.usage.completion_tokens > 0
    assert a["gen_ai.usage.cache_read.input_tokens"] == 0  # the host's first sight of it
    assert a["gen_ai.response.id"] == answer.id
    assert a["gen_ai.request.max_tokens"] == 8
    assert a["server.address"] == "127.0.0.1"
    assert a["server.port"] == crossbar.fakes["titan"].port
    assert a["crossbar.host"] == "titan"
    assert "gen_ai.response.time_to_first_chunk" not in a  # not a stream
    assert "gen_ai.input.messages" not in a and "gen_ai.output.messages" not in a
    assert attempt.status == 0  # not an error

    # The host was asked with a traceparent whose parent is the CLIENT span.
    sent = upstream_traceparents(crossbar, "/v1/chat/completions")
    assert sent == [f"00-{TRACE}-{attempt.span_id}-01"]


@pytest_twisted.ensureDeferred
async def test_a_streamed_turn_records_its_time_to_first_chunk_and_the_cache_it_found(
    receiver,
):
    crossbar = await traced(receiver)
    try:
        await in_thread(chat(crossbar))  # turn 1 warms the host's cache

        def stream() -> list[Any]:
            with client(crossbar) as c:
                return list(
                    c.chat.completions.create(
                        model=MODEL, messages=HELLO, max_tokens=8, stream=True,
                        stream_options={"include_usage": True},
                        extra_headers={"traceparent": f"00-{TRACE}-{PARENT}-01"},
                    )
                )  # fmt: skip

        chunks = await in_thread(stream)
        spans = await spans_of(receiver, crossbar, TRACE, 4)
    finally:
        await crossbar.stop()
    usage = chunks[-1].usage
    attempt = one(spans, f"chat {MODEL}")
    a = attempt.attributes
    assert a["crossbar.stream"] is True
    assert 0 < a["gen_ai.response.time_to_first_chunk"] < attempt.ms / 1000
    assert a["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert a["gen_ai.usage.cache_read.input_tokens"] == usage.prompt_tokens_details.cached_tokens
    assert a["gen_ai.usage.cache_read.input_tokens"] > 0  # the second turn found its prefix
    assert a["gen_ai.usage.output_tokens"] == usage.completion_tokens
    lease = one(spans, "crossbar.lease")
    assert (lease.attributes["crossbar.lease"], lease.attributes["crossbar.lease.reason"]) == (
        "reused",
        "own lease",
    )
    server = one(spans, "POST /r/{route}/v1/chat/completions")
    assert server.parent_id == PARENT
    assert upstream_traceparents(crossbar, "/v1/chat/completions")[-1] == (
        f"00-{TRACE}-{attempt.span_id}-01"
    )


@pytest_twisted.ensureDeferred
async def test_an_anthropic_stream_is_a_chat_span_with_its_usage(receiver):
    crossbar = await traced(receiver)

    def stream() -> Any:
        with anthropic.Anthropic(
            base_url=crossbar.url("convo", ""), api_key="none", max_retries=0
        ) as c:
            with c.messages.stream(
                model="claude-sonnet-4-5", max_tokens=8, messages=HELLO[1:],
                extra_headers={"traceparent": f"00-{TRACE}-{PARENT}-01"},
            ) as s:  # fmt: skip
                list(s.text_stream)
                return s.get_final_message()

    try:
        message = await in_thread(stream)
        spans = await spans_of(receiver, crossbar, TRACE, 4)
    finally:
        await crossbar.stop()
    server = one(spans, "POST /r/{route}/v1/messages")
    attempt = one(spans, f"chat {MODEL}")  # the model the alias named
    assert attempt.parent_id == server.span_id
    assert attempt.attributes["gen_ai.usage.output_tokens"] == message.usage.output_tokens
    assert attempt.attributes["gen_ai.response.id"] == message.id
    assert attempt.attributes["gen_ai.response.time_to_first_chunk"] > 0


@pytest_twisted.ensureDeferred
async def test_without_a_traceparent_a_new_trace_starts_and_the_host_joins_it(receiver):
    crossbar = await traced(receiver)
    try:
        await in_thread(chat(crossbar))
        queue = crossbar.parts.tracing.queue
        await receiver.until(lambda s: len(s) >= 4, flush=queue.flush)
    finally:
        await crossbar.stop()
    server = one(receiver.spans, "POST /r/{route}/v1/chat/completions")
    assert server.parent_id == ""  # a root
    attempt = one(receiver.spans, f"chat {MODEL}")
    assert attempt.trace_id == server.trace_id != TRACE
    (sent,) = upstream_traceparents(crossbar, "/v1/chat/completions")
    assert context_of(sent) == (server.trace_id, attempt.span_id, True)


@pytest_twisted.ensureDeferred
async def test_a_sample_ratio_of_zero_records_no_new_trace_but_follows_a_sampled_caller(
    receiver,
):
    crossbar = await traced(receiver, sample_ratio=0.0)
    try:
        await in_thread(chat(crossbar))  # no caller: not sampled
        await in_thread(chat(crossbar, traceparent=f"00-{TRACE}-{PARENT}-01"))  # sampled
        spans = await spans_of(receiver, crossbar, TRACE, 4)
        crossbar.parts.tracing.queue.flush()
    finally:
        await crossbar.stop()
    assert {s.trace_id for s in receiver.spans} == {TRACE}  # the unsampled turn sent nothing
    unsampled, sampled = upstream_traceparents(crossbar, "/v1/chat/completions")
    assert context_of(unsampled)[2] is False  # the host is told not to record either
    assert context_of(sampled) == (TRACE, one(spans, f"chat {MODEL}").span_id, True)


@pytest_twisted.ensureDeferred
async def test_the_guard_span_shows_the_hosts_exact_count_when_it_refuses(receiver):
    fakes = await start_fakes("titan", ctx=64)
    crossbar = await start_crossbar(fakes, ROUTES, tracing={"endpoint": receiver.endpoint}, ctx=64)
    long = [{"role": "user", "content": " ".join(f"word{i}" for i in range(200))}]

    def refused() -> Any:
        try:
            chat(crossbar, traceparent=f"00-{TRACE}-{PARENT}-01", messages=long)()
        except openai.BadRequestError as e:
            return e
        raise AssertionError("the prompt was not refused")

    try:
        error = await in_thread(refused)
        spans = await spans_of(receiver, crossbar, TRACE, 3)
    finally:
        await crossbar.stop()
    assert error.code == "context_length_exceeded"
    guard = one(spans, "crossbar.guard")
    server = one(spans, "POST /r/{route}/v1/chat/completions")
    assert guard.parent_id == server.span_id
    assert guard.attributes["crossbar.guard.refused"] is True
    assert guard.attributes["crossbar.guard.limit"] == 64
    assert guard.attributes["crossbar.guard.input_tokens"] >= 64
    assert server.attributes["http.response.status_code"] == 400
    assert server.status == 0  # a 4xx is the client's: the server span did not fail
    assert not [s for s in spans if s.kind == "CLIENT"]  # nothing went upstream


@pytest_twisted.ensureDeferred
async def test_a_request_that_queues_has_its_place_and_its_wait_on_the_queue_span(receiver):
    fakes = await start_fakes("titan", parallel=1, tokens_per_second=40)
    crossbar = await start_crossbar(
        fakes, ROUTES, tracing={"endpoint": receiver.endpoint}, parallel=1
    )
    first = f"00-{TRACE}-{PARENT}-01"
    second = f"00-{'1' * 32}-{PARENT}-01"
    try:
        one_turn = deferToThread(chat(crossbar, traceparent=first))
        await until(lambda: crossbar.parts.limiter.in_flight("titan", MODEL) == 1)
        other = [{"role": "user", "content": "Another conversation."}]
        await in_thread(chat(crossbar, traceparent=second, messages=other))
        await wait(one_turn, 60)
        spans = await spans_of(receiver, crossbar, "1" * 32, 4)
    finally:
        await crossbar.stop()
    queue = one(spans, "crossbar.queue")
    assert queue.attributes["crossbar.queue.position"] == 1
    assert queue.attributes["crossbar.queue.wait_ms"] > 20  # behind 8 tokens at 40/s
    assert queue.ms >= queue.attributes["crossbar.queue.wait_ms"] * 0.9


@pytest_twisted.ensureDeferred
async def test_message_contents_are_recorded_only_on_a_route_that_opts_in(receiver):
    crossbar = await traced(receiver)
    other = f"00-{'2' * 32}-{PARENT}-01"
    try:
        answer = await in_thread(chat(crossbar, "open", traceparent=f"00-{TRACE}-{PARENT}-01"))
        await in_thread(chat(crossbar, "convo", traceparent=other))
        opted = await spans_of(receiver, crossbar, TRACE, 4)
        closed = await spans_of(receiver, crossbar, "2" * 32, 4)
    finally:
        await crossbar.stop()
    a = one(opted, f"chat {MODEL}").attributes
    assert json.loads(a["gen_ai.input.messages"]) == [
        {"role": "system", "parts": [{"type": "text", "content": "You review code."}]},
        {"role": "user", "parts": [{"type": "text", "content": "Refactor the parser, please."}]},
    ]
    said = answer.choices[0].message.content
    assert json.loads(a["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": said}]}
    ]
    everything = json.dumps([s.attributes for s in closed])
    assert "Refactor the parser" not in everything and said not in everything


async def answers_while(crossbar: Crossbar, n: int) -> list[tuple[str, float]]:
    """`n` turns of one conversation, one after another: each answer's text and seconds."""
    out = []
    clock = crossbar.parts.clock
    for _ in range(n):
        began = clock.seconds()
        answer = await in_thread(chat(crossbar))
        out.append((answer.choices[0].message.content, clock.seconds() - began))
    return out


@pytest_twisted.ensureDeferred
async def test_a_hung_collector_changes_no_answer_and_its_spans_drop_counted(receiver):
    receiver.mode = "hang"
    crossbar = await traced(receiver, timeout="2s", max_queue=8)
    try:
        answers = await answers_while(crossbar, 12)
        await receiver.until(
            lambda _: receiver.exports >= 1, flush=crossbar.parts.tracing.queue.flush
        )
        metrics = crossbar.parts.metrics.render().decode()
        dropped = crossbar.parts.tracing.queue.dropped
    finally:
        await crossbar.stop()
    assert all(text for text, _ in answers)
    assert len({text for text, _ in answers}) == 1  # the same question, the same answer
    # No answer waited for the collector: the export's 2 s would show in it.
    assert max(seconds for _, seconds in answers) < 1.0
    assert dropped > 0  # 12 turns of 4 spans: 8 wait, 8 more at most are stuck in the export
    assert f"crossbar_trace_spans_dropped_total {float(dropped)}" in metrics


@pytest_twisted.ensureDeferred
async def test_a_refusing_collector_changes_no_answer_and_its_failures_are_counted():
    fakes = await start_fakes("titan")
    crossbar = await start_crossbar(
        fakes, ROUTES, tracing={"endpoint": refusing_endpoint(), "timeout": "1s"}
    )
    queue = crossbar.parts.tracing.queue
    try:
        answers = await answers_while(crossbar, 5)
        queue.flush()
        await until(lambda: queue.failed > 0)
    finally:
        await crossbar.stop()
    assert len({text for text, _ in answers}) == 1 and answers[0][0]
    assert max(seconds for _, seconds in answers) < 1.0
    assert queue.exported == 0


@pytest_twisted.ensureDeferred
async def test_the_collector_gets_the_configured_headers(receiver):
    crossbar = await traced(receiver, headers={"Authorization": "Bearer collector-key"})
    try:
        await in_thread(chat(crossbar))
        await receiver.until(
            lambda _: receiver.exports >= 1, flush=crossbar.parts.tracing.queue.flush
        )
    finally:
        await crossbar.stop()
    assert receiver.headers[0]["authorization"] == "Bearer collector-key"
    assert receiver.headers[0]["content-type"] == "application/x-protobuf"


@pytest_twisted.ensureDeferred
async def test_the_genai_metrics_count_tokens_by_type_and_time_each_operation(receiver):
    crossbar = await traced(receiver)
    try:
        answer = await in_thread(chat(crossbar))
        assert isinstance(crossbar.parts.genai, GenAIMetrics)
        await until(lambda: "gen_ai_client_operation" in crossbar.parts.metrics.render().decode())
        text = crossbar.parts.metrics.render().decode()
    finally:
        await crossbar.stop()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    op = {
        "gen_ai_operation_name": "chat", "gen_ai_request_model": MODEL,
        "route": "convo", "host": "titan",
    }  # fmt: skip

    def sample(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted({**op, **labels}.items())))]

    usage = "gen_ai_client_token_usage_sum"
    assert sample(usage, gen_ai_token_type="input") == answer.usage.prompt_tokens
    assert sample(usage, gen_ai_token_type="output") == answer.usage.completion_tokens
    duration = "gen_ai_client_operation_duration_seconds"
    assert sample(f"{duration}_count", error_type="") == 1
    assert 0 < sample(f"{duration}_sum", error_type="") < 5


@pytest_twisted.ensureDeferred
async def test_with_tracing_off_nothing_is_built_and_the_callers_traceparent_passes_untouched():
    fakes = await start_fakes("titan")
    crossbar = await start_crossbar(fakes, ROUTES)
    caller = f"00-{TRACE}-{PARENT}-01"
    try:
        await in_thread(chat(crossbar, traceparent=caller))
        metrics = crossbar.parts.metrics.render().decode()
    finally:
        await crossbar.stop()
    assert crossbar.parts.tracing is None and crossbar.parts.genai is None
    assert crossbar.sites.resource._tracing is None
    assert not [t for t in threading.enumerate() if t.name == "crossbar-traces"]
    assert upstream_traceparents(crossbar, "/v1/chat/completions") == [caller]
    assert "gen_ai_client" not in metrics and "crossbar_trace_spans" not in metrics


@pytest_twisted.ensureDeferred
async def test_a_refused_connection_is_a_failed_attempt_and_the_lease_span_says_it_moved(
    receiver,
):
    fakes = await start_fakes("titan", "atlas")
    routes = {"convo": {"hosts": ["titan", "atlas"], "default_model": MODEL}}
    crossbar = await start_crossbar(fakes, routes, tracing={"endpoint": receiver.endpoint})
    try:
        await in_thread(chat(crossbar))  # the conversation's lease: titan, first in order
        fakes["titan"].faults.refuse = True
        await fakes["titan"].settle()
        answer = await in_thread(chat(crossbar, traceparent=f"00-{TRACE}-{PARENT}-01"))
        spans = await spans_of(receiver, crossbar, TRACE, 7)
    finally:
        await crossbar.stop()
    assert answer.choices[0].message.content
    server = one(spans, "POST /r/{route}/v1/chat/completions")
    assert server.attributes["crossbar.host"] == "atlas" and server.status == 0
    leases = sorted((s for s in spans if s.name == "crossbar.lease"), key=lambda s: s.start_ns)
    assert [(s.attributes["crossbar.lease"], s.attributes["crossbar.host"]) for s in leases] == [
        ("reused", "titan"),
        ("moved", "atlas"),
    ]
    assert leases[1].attributes["crossbar.lease.reason"] == "unhealthy"
    assert leases[1].attributes["crossbar.lease.from"] == "titan"
    attempts = sorted((s for s in spans if s.kind == "CLIENT"), key=lambda s: s.start_ns)
    assert [(s.attributes["crossbar.host"], s.attributes.get("error.type")) for s in attempts] == [
        ("titan", "refused"),
        ("atlas", None),
    ]
    assert attempts[0].status == 2  # the failed attempt is an error; the request is not
    assert upstream_traceparents(crossbar, "/v1/chat/completions", "atlas") == [
        f"00-{TRACE}-{attempts[1].span_id}-01"
    ]


@pytest_twisted.ensureDeferred
async def test_a_turn_the_valve_moves_has_a_lease_span_saying_so(receiver):
    pace = {"parallel": 1, "tokens_per_second": 20, "prefill_ms_per_token": 2, "reply_tokens": 20}
    fakes = await start_fakes("titan", "atlas", **pace)
    routes = {"convo": {"hosts": ["titan", "atlas"], "default_model": MODEL}}
    crossbar = await start_crossbar(
        fakes, routes, tracing={"endpoint": receiver.endpoint}, parallel=1
    )
    conversations = [
        [{"role": "user", "content": f"Conversation {i}: tidy module {i}."}] for i in range(4)
    ]

    def turn(i: int, traceparent: str | None = None) -> Any:
        def call() -> Any:
            with client(crossbar) as c:
                raw = c.chat.completions.with_raw_response.create(
                    model=MODEL, messages=conversations[i],
                    extra_headers={"traceparent": traceparent} if traceparent else None,
                )  # fmt: skip
            reply = raw.parse().choices[0].message.content
            conversations[i] += [{"role": "assistant", "content": reply}]
            conversations[i] += [{"role": "user", "content": "Next?"}]
            return raw.headers["X-Crossbar-Host"], raw.headers["X-Crossbar-Lease"]

        return call

    try:
        homes = [(await in_thread(turn(i)))[0] for i in range(4)]
        assert homes == ["titan", "atlas", "titan", "atlas"]
        # 0 and 2 share titan: whichever queues moves to idle atlas, its trace says so.
        traces = {0: f"00-{TRACE}-{PARENT}-01", 2: f"00-{'5' * 32}-{PARENT}-01"}
        answers = await wait(
            defer.gatherResults([deferToThread(turn(i, traces[i])) for i in (0, 2)]), 60
        )
        mover = (0, 2)[answers.index(("atlas", "moved"))]
        trace_id = traces[mover].split("-")[1]
        spans = await spans_of(receiver, crossbar, trace_id, 5)
    finally:
        await crossbar.stop()
    leases = sorted((s for s in spans if s.name == "crossbar.lease"), key=lambda s: s.start_ns)
    assert [s.attributes["crossbar.lease"] for s in leases] == ["reused", "moved"]
    moved = leases[1].attributes
    assert (moved["crossbar.lease.reason"], moved["crossbar.lease.from"]) == ("busy", "titan")
    assert moved["crossbar.host"] == "atlas"
    assert moved["crossbar.valve.stay_s"] > moved["crossbar.valve.move_s"]
