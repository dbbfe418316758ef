"""What a request asks of a host in tokens, and what each answer teaches of the host's pace:
the `Work` an inference request brings to its slot, and the rates learned from its answer
(docs/reference.md, "Slots": the expected wait).

A request's work is the prompt tokens its host must prefill (its prompt, the guard's exact
count or else its estimate, less what the host is expected to hold of it: its conversation's
last turn unless the host has been evicting lately, or what the route's conversations find
there on their first turn) and the output tokens it is expected to write (its own limit, or
its key's or route's mean output when that is less or it sets none).
"""

from __future__ import annotations

import math

from crossbar.leases import Warmth
from crossbar.limiter import Rates
from crossbar.proxy.call import Call
from crossbar.wire import Exchange


def output_limit(call: Call) -> int | None:
    """The output tokens a call asks for at most (its dialect's max_tokens and the like)."""
    body = call.inbound.body
    if not isinstance(body, dict):
        return None
    for name in call.dialect.output_fields:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def expected_output(call: Call, rates: Rates, key_mean: float | None = None) -> tuple[int, bool]:
    """The output tokens `call` is expected to write: the mean of its key's turns, else of its
    route's (a default before any), but never more than its own limit. A limit is a ceiling,
    not an estimate: Claude Code asks for 32000 tokens and writes a few hundred. And whether
    that is informed (a learned mean, or its own limit below the default), not a guess."""
    route = call.route.name
    mean = key_mean if key_mean is not None else rates.output(route)
    limit = output_limit(call)
    expected = mean if limit is None else min(limit, mean)
    informed = key_mean is not None or rates.knows_output(route) or expected != mean
    return max(1, round(expected)), informed


def held_on(
    warmth: Warmth, host: str, call: Call, prompt: int, warm: int, home: bool = True
) -> int:
    """Tokens of `call`'s prompt that `host` is expected to hold: on its home host (`home`)
    its conversation's last turn (`warm` tokens), less the share the host has been evicting
    lately; on any host, what the route's conversations find there on their first turn (a
    shared system prompt)."""
    route, model = call.route.name, call.model
    shared = warmth.shared(host, route, model)
    if home:
        kept = round(min(warm, prompt) * (1.0 - warmth.eviction_share(host)))
        shared = max(shared, kept)
    return min(prompt, shared)


def learn(
    rates: Rates,
    call: Call,
    ex: Exchange,
    sent: float,
    ended: float,
    loading: float | None = None,
) -> float:
    """Teach `rates` what a complete answer says of its host's pace and its route's output:
    llama.cpp's `timings` when the answer has them, else what crossbar saw of a stream (the
    time to its first byte for the prefill, the rest for the output). `loading`: when the
    model began to load on a router-mode host, the request waiting for it; its wait for the
    first byte then teaches nothing of the host's pace, and what of it the prefill and the
    host's overhead do not explain is returned (the load's seconds; 0 when unknown)."""
    tokens = ex.tokens
    if ex.status != 200 or ex.error or tokens.refused:
        return 0.0  # a refused answer's counts are gone (wire/reported.py): nothing to learn
    rates.learn_output(call.route.name, tokens.completion)
    prefilled = max(0, tokens.prompt - tokens.cached)
    timed = tokens.prompt_ms > 0 or tokens.predicted_ms > 0
    if timed:
        prefill_s, decode_s = tokens.prompt_ms / 1000, tokens.predicted_ms / 1000
        decoded = tokens.completion
    elif ex.stream and ex.first_byte is not None and loading is None:
        # The first event carries the first token: the rest are the decode's.
        prefill_s, decode_s = ex.first_byte - sent, ended - ex.first_byte
        decoded = tokens.completion - 1
    else:
        return 0.0
    if not (math.isfinite(prefill_s) and math.isfinite(decode_s)):
        return 0.0
    rates.learn(ex.host, call.model, prefilled, prefill_s, decoded, decode_s)
    if ex.first_byte is None or not timed:
        return 0.0
    # What the host's timings leave out of the wait for the first byte: the exchange,
    # tokenizing, templating (and the output too, for an answer that comes whole), and a load.
    before = ex.first_byte - sent - prefill_s - (0.0 if ex.stream else decode_s)
    if loading is None:
        rates.learn_overhead(ex.host, call.model, before)
        return 0.0
    waited = ex.first_byte - min(sent, loading) - prefill_s - (0.0 if ex.stream else decode_s)
    return max(0.0, waited - rates.overhead(ex.host, call.model))


def stopped_run(
    rates: Rates, host: str, model: str, prompt: int, cached: int, seconds: float,
    limit: int | None,
) -> tuple[int, int, int]:  # fmt: skip
    """What a run stopped after `seconds` on `host` did, by the host's learned pace (it never
    said): (prompt tokens read, of them cached, output tokens written). It read the uncached
    part of `prompt` at its prefill rate after its overhead, then wrote at its decode rate,
    never past `limit`."""
    busy = max(0.0, seconds - rates.overhead(host, model))
    uncached = max(0, prompt - cached)
    read = min(uncached, int(busy * rates.prefill(host, model)))
    writing = busy - uncached / rates.prefill(host, model) if read == uncached else 0.0
    written = int(max(0.0, writing) * rates.decode(host, model))
    if limit is not None:
        written = min(written, limit)
    return min(cached, prompt) + read, min(cached, prompt), written
