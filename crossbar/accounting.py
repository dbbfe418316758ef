"""Reading usage and completion ids out of responses as they pass, without holding streams."""

from __future__ import annotations

import json
import re
from typing import Any

from attrs import define, field

# A JSON (non-stream) body is kept for parsing only up to this size; past it, usage is unknown.
JSON_KEEP = 8 * 1024 * 1024
# A JSON body larger than this (an embeddings batch, say) is not parsed whole on the reactor:
# json.loads of 2.7 MB takes ~16 ms, a search for its `usage` and `timings` objects ~0.7 ms.
JSON_PARSE = 256 * 1024
_USAGE_OBJECT = re.compile(rb'"(usage|timings)"\s*:\s*(\{(?:[^{}]|\{[^{}]*\})*\})')
# A single SSE line longer than this is not parsed (and not kept).
LINE_KEEP = 1024 * 1024


@define
class Tokens:
    """Token counts of one response: prompt (all of it), cached (of the prompt), completion."""

    prompt: int = 0
    cached: int = 0
    completion: int = 0


def read_usage(obj: Any, tokens: Tokens) -> bool:
    """Fill `tokens` from an object's `usage` and/or `timings`; True if anything was found."""
    if not isinstance(obj, dict):
        return False
    found = False
    usage = obj.get("usage")
    if not isinstance(usage, dict) and isinstance(obj.get("response"), dict):
        usage = obj["response"].get("usage")  # Responses API events wrap the response
    if not isinstance(usage, dict) and isinstance(obj.get("message"), dict):
        usage = obj["message"].get("usage")  # Anthropic message_start
    if isinstance(usage, dict):
        found = True
        prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
        completion = usage.get("completion_tokens", usage.get("output_tokens"))
        details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if cached is None:
            cached = usage.get("cache_read_input_tokens")
        if isinstance(prompt, int):
            tokens.prompt = prompt
            if "cache_read_input_tokens" in usage:
                # Anthropic counts cache reads (and writes) apart from input_tokens.
                for extra in ("cache_read_input_tokens", "cache_creation_input_tokens"):
                    if isinstance(usage.get(extra), int):
                        tokens.prompt += usage[extra]
        if isinstance(completion, int):
            tokens.completion = completion
        if isinstance(cached, int):
            tokens.cached = cached
    timings = obj.get("timings")
    if isinstance(timings, dict):
        found = True
        cache_n, prompt_n = timings.get("cache_n"), timings.get("prompt_n")
        predicted_n = timings.get("predicted_n")
        if isinstance(cache_n, int):
            tokens.cached = cache_n
        if isinstance(cache_n, int) and isinstance(prompt_n, int):
            tokens.prompt = cache_n + prompt_n
        if isinstance(predicted_n, int):
            tokens.completion = predicted_n
    return found


def read_id(obj: Any) -> str | None:
    """The completion or response id of a body or event."""
    if not isinstance(obj, dict):
        return None
    value = obj.get("id")
    if isinstance(value, str) and value:
        return value
    for wrapper in ("response", "message"):  # Responses events, Anthropic message_start
        inner = obj.get(wrapper)
        if isinstance(inner, dict) and isinstance(inner.get("id"), str) and inner["id"]:
            return inner["id"]
    return None


def _usage_objects(body: bytes) -> dict[str, Any]:
    """`usage` and `timings` found anywhere in a large JSON body, without parsing all of it."""
    found: dict[str, Any] = {}
    for match in _USAGE_OBJECT.finditer(body):
        try:
            found.setdefault(match.group(1).decode(), json.loads(match.group(2)))
        except ValueError:
            continue
    return found


@define
class Meter:
    """Watches one response go by. `feed` every chunk; read `tokens`, `ids` and `events` after.

    SSE: each `data:` line is parsed only if it may carry usage, timings or the first id, so a
    long stream costs one substring search per line. JSON: the body is kept up to JSON_KEEP
    and parsed whole only up to JSON_PARSE; past that only `usage` and `timings` are read.
    """

    stream: bool
    tokens: Tokens = field(factory=Tokens)
    ids: list[str] = field(factory=list)
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
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        self.events += 1
        wanted = not self.ids or b'"usage"' in payload or b'"timings"' in payload
        if not wanted:
            return
        try:
            obj = json.loads(payload)
        except ValueError:
            return
        if not self.ids:
            found = read_id(obj)
            if found:
                self.ids.append(found)
        if read_usage(obj, self.tokens):
            self._usage_seen = True
        if isinstance(obj, dict) and obj.get("type") in ("response.completed", "message_stop"):
            self.done = True

    def finish(self) -> None:
        """The body is complete: parse what was kept."""
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
            read_usage(_usage_objects(body), self.tokens)
            return
        try:
            obj = json.loads(body)
        except ValueError:
            return
        found = read_id(obj)
        if found:
            self.ids.append(found)
        read_usage(obj, self.tokens)

    def delivered(self) -> None:
        """The stream broke: count what reached the client when no usage arrived."""
        if self.stream and not self._usage_seen:
            self.tokens.completion = self.events
