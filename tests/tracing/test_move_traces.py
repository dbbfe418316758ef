"""A move crossbar makes itself is a trace of its own: evacuating a host gives each moved
conversation a `crossbar.move` span linked to its last turn's SERVER span, with the prewarm
as a CLIENT span under it, whose context the new host receives."""

from __future__ import annotations

import pytest_twisted

from tests.support.harness import MODEL, start_crossbar, start_fakes, wait
from tests.support.otlp import start_receiver, traced_chat

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
ROUTES = {"convo": {"hosts": ["a", "b"], "default_model": MODEL}}
OPENING = [{"role": "user", "content": "Read this module and tell me what it does. " * 20}]


@pytest_twisted.ensureDeferred
async def test_an_evacuation_moves_a_conversation_in_a_span_linked_to_its_last_turn():
    receiver = await start_receiver()
    fakes = await start_fakes("a", "b")
    crossbar = await start_crossbar(
        fakes, ROUTES, server={"handoff_store": "64MiB"}, tracing={"endpoint": receiver.endpoint}
    )
    queue = crossbar.parts.tracing.queue
    try:
        hosts = crossbar.parts.hosts
        await hosts.drain("b")
        caller = f"00-{TRACE}-{PARENT}-01"
        response, _ = await wait(traced_chat(crossbar, "convo", OPENING, caller, max_tokens=4))
        assert response.headers.getRawHeaders("X-Crossbar-Host") == ["a"]
        await hosts.undrain("b")
        await wait(crossbar.parts.handoff.store.flushed())
        evacuation = await crossbar.parts.handoff.evacuator.start("a")
        await wait(evacuation.done, 30)
        await receiver.until(lambda s: any(x.name == "crossbar.move" for x in s), flush=queue.flush)
        await receiver.until(lambda s: len(s) >= 6, flush=queue.flush)
    finally:
        await crossbar.stop()
        await receiver.stop()

    turn = next(s for s in receiver.trace(TRACE) if s.kind == "SERVER")
    move = next(s for s in receiver.spans if s.name == "crossbar.move")
    assert move.parent_id == "" and move.trace_id != TRACE  # a trace of its own...
    assert move.links == [(TRACE, turn.span_id)]  # ...linked to the conversation's last turn
    fp = crossbar.parts.table.snapshot()[0].key.fp
    assert move.attributes["gen_ai.conversation.id"] == fp
    assert move.attributes["crossbar.move.reason"] == "evacuate"
    assert (move.attributes["crossbar.move.from"], move.attributes["crossbar.host"]) == ("a", "b")
    assert move.attributes["crossbar.move.moved"] is True
    assert move.attributes["crossbar.prewarm.result"] == "warm"

    prewarm = next(s for s in receiver.trace(move.trace_id) if s.kind == "CLIENT")
    assert prewarm.parent_id == move.span_id
    assert prewarm.name == f"chat {MODEL}"
    assert prewarm.attributes["crossbar.prewarm"] is True
    assert prewarm.attributes["gen_ai.usage.input_tokens"] > 0
    sent = [
        h.getRawHeaders(b"traceparent")[-1].decode()
        for path, h in fakes["b"].counters.seen
        if path == "/v1/chat/completions" and h.getRawHeaders(b"traceparent")
    ]
    assert len(sent) == 1 and sent[0].startswith(f"00-{move.trace_id}-{prewarm.span_id}-")
