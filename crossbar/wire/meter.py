"""Reading usage and completion ids out of responses as they pass, without holding streams."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import orjson
from attrs import define, field

from crossbar.wire.reported import millis, refusal

# A JSON (non-stream) body is kept for parsing only up to this size; past it, usage is unknown.
JSON_KEEP = 8 * 1024 * 1024
# A JSON body larger than this (an embeddings batch, say) is not parsed whole on the reactor:
# parsing 2.7 MB of JSON took ~16 ms, a search for its `usage` and `timings` objects ~0.7 ms.
JSON_PARSE = 256 * 1024
_USAGE_OBJECT = re.compile(rb'"(usage|timings)"\s*:\s*(\{(?:[^{}]|\{[^{}]*\})*\})')
# An SSE event parsed once the first id is known: one that may carry usage or timings (one
# regex pass: two substring searches cost twice as much on every event of a stream).
_WANTED = re.compile(rb'"(?:usage|timings)"')
_DONE_LONGEST = 32  # `data: [DONE]` with whatever spaces and CR a host puts around it
# A single SSE line longer than this is not parsed (and not kept).
LINE_KEEP = 1024 * 1024


def _loads(data: bytes) -> Any:
    """JSON read by orjson (a quarter of the standard library's CPU), and what it refuses by
    the standard library (NaN, integers past 64 bits): ValueError when neither reads it."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


@define
class Tokens:
    """Token counts of one response: prompt (all of it), cached (of the prompt), completion;
    and, when the host said (llama.cpp's `timings`), the milliseconds its prefill of the
    uncached part and its output took (0: not said)."""

    prompt: int = 0
    cached: int = 0
    completion: int = 0
    prompt_ms: float = field(default=0.0, eq=False)
    predicted_ms: float = field(default=0.0, eq=False)
    # Why the host's counts were refused (wire/reported.py REPORT_REASONS), "" when they were not.
    refused: str = field(default="", eq=False)


Reader = Callable[[Any, "Tokens"], bool]  # fills tokens from one object; True if it had any
IdReader = Callable[[Any], "str | None"]


def _fill(usage: Any, tokens: Tokens) -> bool:
    """Fill `tokens` from a `usage` object in OpenAI's names (prompt/completion) or the
    Responses and Anthropic ones (input/output); Anthropic counts cache reads (and writes)
    apart from input_tokens, so they are added to the prompt."""
    if not isinstance(usage, dict):
        return False
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None:
        cached = usage.get("cache_read_input_tokens")
    if isinstance(prompt, int):
        tokens.prompt = prompt
        if "cache_read_input_tokens" in usage:
            for extra in ("cache_read_input_tokens", "cache_creation_input_tokens"):
                if isinstance(usage.get(extra), int):
                    tokens.prompt += usage[extra]
    if isinstance(completion, int):
        tokens.completion = completion
    if isinstance(cached, int):
        tokens.cached = cached
    return True


def _timings(obj: dict[str, Any], tokens: Tokens) -> bool:
    """llama.cpp's own `timings`: the prompt is the cached plus the processed tokens."""
    timings = obj.get("timings")
    if not isinstance(timings, dict):
        return False
    cache_n, prompt_n = timings.get("cache_n"), timings.get("prompt_n")
    predicted_n = timings.get("predicted_n")
    for name in ("prompt_ms", "predicted_ms"):
        ms = millis(timings.get(name))
        if ms is not None:
            setattr(tokens, name, ms)  # checked with the counts when the answer ends
    if isinstance(cache_n, int):
        tokens.cached = cache_n
    if isinstance(cache_n, int) and isinstance(prompt_n, int):
        tokens.prompt = cache_n + prompt_n
    if isinstance(predicted_n, int):
        tokens.completion = predicted_n
    return True


def _inner(obj: dict[str, Any], wrapper: str, key: str) -> Any:
    value = obj.get(key)
    if value is None and isinstance(obj.get(wrapper), dict):
        value = obj[wrapper].get(key)
    return value


def openai_usage(obj: Any, tokens: Tokens) -> bool:
    """Chat completions, completions, embeddings, llama.cpp's native answers."""
    if not isinstance(obj, dict):
        return False
    found = _fill(obj.get("usage"), tokens)
    return _timings(obj, tokens) or found


def responses_usage(obj: Any, tokens: Tokens) -> bool:
    """OpenAI Responses: streamed events wrap the response (`response.completed`)."""
    if not isinstance(obj, dict):
        return False
    found = _fill(_inner(obj, "response", "usage"), tokens)
    return _timings(obj, tokens) or found


def anthropic_usage(obj: Any, tokens: Tokens) -> bool:
    """Anthropic messages: `message_start` wraps the message; `message_delta` has output."""
    if not isinstance(obj, dict):
        return False
    found = _fill(_inner(obj, "message", "usage"), tokens)
    return _timings(obj, tokens) or found


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def openai_id(obj: Any) -> str | None:
    """The completion id of a body or chunk."""
    return _string(obj.get("id")) if isinstance(obj, dict) else None


def responses_id(obj: Any) -> str | None:
    """The response id of a body or of an event wrapping the response."""
    return _string(_inner(obj, "response", "id")) if isinstance(obj, dict) else None


def anthropic_id(obj: Any) -> str | None:
    """The message id of a body or of `message_start`."""
    return _string(_inner(obj, "message", "id")) if isinstance(obj, dict) else None


def _usage_objects(body: bytes) -> dict[str, Any]:
    """`usage` and `timings` found anywhere in a large JSON body, without parsing all of it."""
    found: dict[str, Any] = {}
    for match in _USAGE_OBJECT.finditer(body):
        try:
            found.setdefault(match.group(1).decode(), _loads(match.group(2)))
        except ValueError:
            continue
    return found


def _ignore(_: str) -> None:
    pass


@define
class Meter:
    """Watches one response go by. `feed` every chunk; read `tokens` and `id` after.

    `usage` and `read_id` are the dialect's readers; `on_id` hears the completion id once, as
    soon as it shows (a control call may name a running stream's id before the stream ends).
    SSE: each `data:` line is parsed only if it may carry usage, timings or the first id, so a
    long stream costs one substring search per line. JSON: the body is kept up to JSON_KEEP
    and parsed whole only up to JSON_PARSE; past that only `usage` and `timings` are read.
    """

    stream: bool
    usage: Reader = openai_usage
    read_id: IdReader = openai_id
    on_id: Callable[[str], None] = _ignore
    tokens: Tokens = field(factory=Tokens)
    id: str | None = None
    events: int = 0  # SSE data events seen, [DONE] excluded: the tokens actually delivered
    done: bool = False  # saw `data: [DONE]` or a final event
    _partial: bytearray = field(factory=bytearray)
    _json: bytearray = field(factory=bytearray)
    _overflow: bool = False
    _usage_seen: bool = False

    def feed(self, data: bytes) -> None:
        if not self.stream:
            if not self._overflow:
                if len(self._json) + len(data) > JSON_KEEP:
                    self._overflow = True
                    self._json.clear()
                else:
                    self._json += data
            return
        if not self._partial and data.endswith(b"\n"):
            # The usual chunk: whole events, nothing held over; no copy into _partial.
            for line in data.split(b"\n"):
                if line:
                    self._line(line)
            return
        self._partial += data
        if b"\n" not in data:
            if len(self._partial) > LINE_KEEP:
                self._partial.clear()
            return
        *lines, rest = bytes(self._partial).split(b"\n")
        self._partial = bytearray(rest)
        for line in lines:
            self._line(line)

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        if self.id is not None and _WANTED.search(line) is None:
            # The usual event of a stream: counted, not copied or parsed.
            if len(line) <= _DONE_LONGEST and line[5:].strip() == b"[DONE]":
                self.done = True
            else:
                self.events += 1
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        self.events += 1
        try:
            obj = _loads(payload)
        except ValueError:
            return
        self._take_id(obj)
        if self.usage(obj, self.tokens):
            self._usage_seen = True
        if isinstance(obj, dict) and obj.get("type") in ("response.completed", "message_stop"):
            self.done = True

    def _take_id(self, obj: Any) -> None:
        if self.id is None:
            found = self.read_id(obj)
            if found:
                self.id = found
                self.on_id(found)

    def finish(self) -> None:
        """The body is complete: parse what was kept, and check what the host said."""
        self._finish()
        self._check()

    def _finish(self) -> None:
        if self.stream:
            if self._partial:
                self._line(bytes(self._partial))
                self._partial.clear()
            if not self._usage_seen:
                self.tokens.completion = self.events
            return
        if self._overflow or not self._json:
            return
        body = bytes(self._json)
        self._json.clear()
        if len(body) > JSON_PARSE:
            # Only the counts: a body this large is embeddings or a very long finished answer,
            # whose id no side call will ask for.
            self.usage(_usage_objects(body), self.tokens)
            return
        try:
            obj = _loads(body)
        except ValueError:
            return
        self._take_id(obj)
        self.usage(obj, self.tokens)

    def delivered(self) -> None:
        """The stream broke: count what reached the client when no usage arrived."""
        if self.stream and not self._usage_seen:
            self.tokens.completion = self.events
        self._check()

    def _check(self) -> None:
        """Counts a host cannot have meant (wire/reported.py) are dropped, all of them: the
        answer keeps only what crossbar saw itself (a stream's events), and says why."""
        tokens = self.tokens
        why = refusal(tokens)
        if why:
            self.tokens = Tokens(completion=self.events if self.stream else 0, refused=why)
