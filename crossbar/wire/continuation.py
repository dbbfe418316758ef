"""Continuing an answer its host cut (docs/reference.md, "Answers that survive their host").

A `Transcript` reads a stream as the client gets it: the text so far, the ids the client was
shown, the tokens it holds, and whether the answer can be continued at all (not inside a tool
call, not past its end). `continuation_body` is the request that asks another host to go on
from there: for chat and Anthropic messages the text as a trailing assistant message (which
llama-server continues, echoing it at the start of its answer), for raw completions the prompt
plus the text. A `Splice` rewrites the continuation's events into the client's stream: the
first stream's id, creation time and model, no second role delta or `message_start`, the echo
stripped exactly, and the usage counting both hosts' tokens.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import orjson
from attrs import define, field

from crossbar.wire.dialects import (
    ANTHROPIC,
    LLAMA_COMPLETION,
    OPENAI_CHAT,
    OPENAI_COMPLETIONS,
    Dialect,
)


class Family(enum.Enum):
    """The stream shapes crossbar can continue."""

    CHAT = "chat"  # OpenAI chat completions
    ANTHROPIC = "anthropic"  # Anthropic messages
    COMPLETIONS = "completions"  # OpenAI completions
    NATIVE = "native"  # llama.cpp's /completion


_FAMILIES = {
    OPENAI_CHAT.name: Family.CHAT,
    ANTHROPIC.name: Family.ANTHROPIC,
    OPENAI_COMPLETIONS.name: Family.COMPLETIONS,
    LLAMA_COMPLETION.name: Family.NATIVE,
}
_CONTINUED_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/messages", "/v1/completions", "/completion", "/completions"}
)

# Why an answer cannot be continued (the `reason` of crossbar_resumes_total{outcome="refused"}).
TOOL_CALL = "tool_call"  # cut inside (or after) a streamed tool call
REASONING = "reasoning"  # cut while the model was reasoning: its thinking cannot be prefilled
FINISHED = "finished"  # cut after the answer's own end: nothing is left to generate
CHOICES = "n"  # several choices (n > 1)
STRUCTURED = "structured"  # response_format, json_schema, grammar: a prefix restarts the grammar
PROMPT = "prompt"  # a raw prompt that is not one string (tokens, several prompts)
DIALECT = "dialect"  # an API crossbar does not continue (Responses, infill, embeddings)


def family(dialect: Dialect, path: str) -> Family | None:
    """The stream shape of an inference request on `path`, or None where none is continued."""
    if path not in _CONTINUED_PATHS:
        return None
    return _FAMILIES.get(dialect.name)


def refusal(dialect: Dialect, path: str, body: Any) -> str:
    """Why a request's answer could never be continued, whatever is cut ("" when it could)."""
    kind = family(dialect, path)
    if kind is None or not isinstance(body, dict):
        return DIALECT
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n > 1:
        return CHOICES
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        return STRUCTURED
    if body.get("grammar") or body.get("json_schema"):
        return STRUCTURED
    output = body.get("output_format") or body.get("output_config")
    if isinstance(output, dict) and output:
        return STRUCTURED  # Anthropic's structured outputs
    if kind in (Family.COMPLETIONS, Family.NATIVE) and not isinstance(body.get("prompt"), str):
        return PROMPT
    return ""


class _Events:
    """SSE events out of a byte stream: (name, data) per event, as blank lines end them."""

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        buffer = self._rest + data
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        *whole, self._rest = buffer.split(b"\n\n")
        return [parsed for raw in whole if (parsed := _event(raw)) is not None]


def _event(raw: bytes) -> tuple[bytes, bytes] | None:
    if raw.startswith(b"data: ") and b"\n" not in raw:
        return b"", raw[6:]  # the usual event: one data line, no name
    name, data = b"", []
    for line in raw.split(b"\n"):
        if line.startswith(b"data:"):
            data.append(line[5:].removeprefix(b" "))
        elif line.startswith(b"event:"):
            name = line[6:].strip()
    if not data:
        return None
    return name, b"\n".join(data)


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def sse(name: bytes, obj: Any) -> bytes:
    """One SSE event: `event:` (when named) and `data:` with `obj` as JSON."""
    data = b"data: " + (obj if isinstance(obj, bytes) else orjson.dumps(obj)) + b"\n\n"
    return b"event: " + name + b"\n" + data if name else data


# Bytes of a stream a transcript keeps unread: it is read when the stream is cut (most never
# are: an answer relayed whole costs its events no parse), or when this much has waited.
KEEP_UNREAD = 64 * 1024


@define
class Transcript:
    """A stream as its client got it. `feed` keeps the bytes; they are read only when asked
    (`text`, `why_not`...), so a stream that is never cut is never parsed."""

    kind: Family
    _parts: list[str] = field(factory=list)  # the text's pieces (joined when asked)
    _pieces: int = 0
    _ids: tuple[Any, Any, Any] | None = None  # the first event's id, created, model
    _blocked: str = ""
    _finished: bool = False
    _open_block: int | None = None  # Anthropic: the index of the text block still open
    _blocks: int = 0  # Anthropic: content blocks begun
    _unread: list[bytes] = field(factory=list)
    _unread_bytes: int = 0
    _events: _Events = field(factory=_Events)

    def feed(self, data: bytes) -> None:
        """Keep one chunk of the stream."""
        self._unread.append(data)
        self._unread_bytes += len(data)
        if self._unread_bytes > KEEP_UNREAD:
            self._read()

    def _read(self) -> None:
        if not self._unread:
            return
        data = b"".join(self._unread)
        self._unread.clear()
        self._unread_bytes = 0
        for name, payload in self._events.feed(data):
            self.take(name, payload)

    @property
    def text(self) -> str:
        """The answer's text the client has."""
        self._read()
        parts = self._parts
        if len(parts) > 1:
            parts[:] = ["".join(parts)]
        return parts[0] if parts else ""

    @property
    def pieces(self) -> int:
        """Events that carried text: about the tokens the client has."""
        self._read()
        return self._pieces

    @property
    def id(self) -> Any:
        """The id the client saw (None before the first event with one)."""
        self._read()
        return self._ids[0] if self._ids else None

    @property
    def created(self) -> Any:
        self._read()
        return self._ids[1] if self._ids else None

    @property
    def model(self) -> Any:
        self._read()
        return self._ids[2] if self._ids else None

    @property
    def open_block(self) -> int | None:
        """Anthropic: the index of the client's text block still open (None: none is)."""
        self._read()
        return self._open_block

    def why_not(self) -> str:
        """Why the answer cannot be continued from here, "" when it can."""
        self._read()
        return self._blocked or (FINISHED if self._finished else "")

    def take(self, name: bytes, payload: bytes) -> None:
        """Read one event."""
        if payload[:1] != b"{" and payload.strip() == b"[DONE]":
            self._finished = True
            return
        obj = _loads(payload)
        if not isinstance(obj, dict):
            return
        if self.kind is Family.ANTHROPIC:
            self._anthropic(obj)
            return
        if self._ids is None:
            self._ids = (obj.get("id"), obj.get("created"), obj.get("model"))
        if self.kind is Family.NATIVE:
            self._text(obj.get("content"))
            if obj.get("stop") is True:
                self._finished = True
            return
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) != 0:
                self._blocked = self._blocked or CHOICES
            if self.kind is Family.COMPLETIONS:
                self._text(choice.get("text"))
            else:
                delta = choice.get("delta")
                if isinstance(delta, dict):
                    if delta.get("tool_calls") or delta.get("function_call"):
                        self._blocked = self._blocked or TOOL_CALL
                    if delta.get("reasoning_content") or delta.get("reasoning"):
                        self._blocked = self._blocked or REASONING
                    self._text(delta.get("content"))
            if choice.get("finish_reason") is not None:
                self._finished = True

    def _text(self, piece: Any) -> None:
        if piece and isinstance(piece, str):
            self._parts.append(piece)
            self._pieces += 1

    def _anthropic(self, obj: dict[str, Any]) -> None:
        kind = obj.get("type")
        if kind == "message_start":
            message = obj.get("message")
            if isinstance(message, dict) and self._ids is None:
                self._ids = (message.get("id"), None, message.get("model"))
        elif kind == "content_block_start":
            self._blocks += 1
            block = obj.get("content_block")
            block_type = block.get("type") if isinstance(block, dict) else None
            if block_type == "text" and self._blocks == 1:
                self._open_block = obj.get("index", 0)
            elif block_type in ("thinking", "redacted_thinking"):
                self._blocked = self._blocked or REASONING
            else:
                self._blocked = self._blocked or TOOL_CALL
        elif kind == "content_block_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict):
                if delta.get("type") == "text_delta":
                    self._text(delta.get("text"))
                elif delta.get("type") == "input_json_delta":
                    self._blocked = self._blocked or TOOL_CALL
                elif delta.get("type") in ("thinking_delta", "signature_delta"):
                    self._blocked = self._blocked or REASONING
        elif kind == "content_block_stop":
            self._open_block = None
            self._finished = True  # llama-server's one text block ended: the answer has
        elif kind in ("message_delta", "message_stop"):
            self._finished = True


def continuation_body(kind: Family, body: dict[str, Any], text: str, sent: int) -> dict[str, Any]:
    """The request that continues `body`'s answer past `text` (`sent` tokens of it given):
    the text as a trailing assistant message, or after the raw prompt; its output limit less
    what was sent (1 at least: the host ends it at once if nothing was left)."""
    out = dict(body)
    if kind in (Family.CHAT, Family.ANTHROPIC):
        prefix = text.rstrip()  # templates trim an assistant message's end; the echo would too
        if prefix:
            out["messages"] = [*body["messages"], {"role": "assistant", "content": prefix}]
    elif text:
        out["prompt"] = body["prompt"] + text
    for name in ("max_tokens", "max_completion_tokens", "n_predict", "max_output_tokens"):
        limit = body.get(name)
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            out[name] = max(1, limit - sent)
    return out


class NotContinued(Exception):
    """The continuation's host did not continue the text (it answered a new turn)."""


class _Echo:
    """Strips the prefilled text a host echoes at its answer's start, exactly: the prefix it
    was given must come back whole (else it did not continue); the trailing whitespace the
    client already had but the host was not given is taken off the new text where it comes
    back first."""

    def __init__(self, text: str, chat: bool) -> None:
        given = text.rstrip() if chat else ""
        self._given = given
        self._tail = text[len(given) :] if chat else ""

    @property
    def confirmed(self) -> bool:
        """All the given text came back: the host continued it."""
        return not self._given

    def take(self, piece: str) -> str:
        """What of `piece` the client has not seen; raises NotContinued on a new answer."""
        if self._given:
            n = min(len(piece), len(self._given))
            if piece[:n] != self._given[:n]:
                raise NotContinued(f"the host answered {piece[:40]!r}, not the text it was given")
            self._given, piece = self._given[n:], piece[n:]
            if self._given or not piece:
                return ""
        tail = self._tail
        if not tail:
            return piece
        n = 0
        while n < len(piece) and n < len(tail) and piece[n] == tail[n]:
            n += 1
        self._tail = tail[n:] if n == len(piece) else ""
        return piece[n:]


@define
class Before:
    """What the client had before a continuation: its text, the tokens of it, and the prompt
    tokens the first host reported (0 when it had not said)."""

    text: str
    pieces: int
    resumed: int  # continuations so far, this one included


class Splice:
    """Rewrites a continuation's stream into the client's: `feed` the host's bytes; what the
    client gets goes to `write` (and to the transcript, which stays the client's view). Nothing
    is written before the echo is confirmed; a host that did not continue raises NotContinued
    from `feed` with nothing of its answer written."""

    def __init__(self, transcript: Transcript, before: Before, write: Callable[[bytes], None]):
        self._t = transcript
        self._before = before
        self._write = write
        self._events = _Events()
        kind = transcript.kind
        self._echo = _Echo(before.text, kind in (Family.CHAT, Family.ANTHROPIC))
        self._held: list[bytes] = []  # events before the echo is confirmed

    @property
    def confirmed(self) -> bool:
        """The host continued the text (all of its echo came back)."""
        return self._echo.confirmed

    def feed(self, data: bytes) -> None:
        for name, payload in self._events.feed(data):
            out = self._rewrite(name, payload)
            if out is None:
                continue
            if not self._echo.confirmed:
                self._held.append(out)
                continue
            if self._held:
                out = b"".join(self._held) + out
                self._held.clear()
            self._t.feed(out)
            self._write(out)

    def _rewrite(self, name: bytes, payload: bytes) -> bytes | None:
        if payload.strip() == b"[DONE]":
            return sse(name, b"[DONE]")
        obj = _loads(payload)
        if not isinstance(obj, dict):
            return sse(name, payload)
        kind = self._t.kind
        if kind is Family.ANTHROPIC:
            return self._anthropic(name, obj)
        t = self._t
        for field_name, value in (("id", t.id), ("created", t.created), ("model", t.model)):
            if value is not None and field_name in obj:
                obj[field_name] = value
        if kind is Family.NATIVE:
            obj["content"] = self._strip(obj.get("content"))
            if not obj["content"] and obj.get("stop") is not True:
                return None
        else:
            keep = [c for c in obj.get("choices") or () if self._choice(c)]
            if not keep and obj.get("choices") and not isinstance(obj.get("usage"), dict):
                return None
            if obj.get("choices"):
                obj["choices"] = keep
        self._usage(obj.get("usage"), "prompt_tokens", "completion_tokens")
        return sse(name, obj)

    def _choice(self, choice: Any) -> bool:
        """Rewrite one choice in place; False when nothing of it is left to send."""
        if not isinstance(choice, dict):
            return True
        if self._t.kind is Family.COMPLETIONS:
            choice["text"] = self._strip(choice.get("text"))
            return bool(choice["text"]) or choice.get("finish_reason") is not None
        delta = choice.get("delta")
        if isinstance(delta, dict):
            delta.pop("role", None)  # the client had its role delta from the first host
            if isinstance(delta.get("content"), str):
                delta["content"] = self._strip(delta["content"])
                if not delta["content"]:
                    del delta["content"]
        meaningful = isinstance(delta, dict) and any(v is not None for v in delta.values())
        return meaningful or choice.get("finish_reason") is not None

    def _anthropic(self, name: bytes, obj: dict[str, Any]) -> bytes | None:
        kind = obj.get("type")
        t = self._t
        if kind == "message_start":
            return None  # the client has the first host's
        if kind == "content_block_start":
            block = obj.get("content_block")
            if isinstance(block, dict) and block.get("type") == "text":
                if t.open_block is not None:
                    return None  # the client's text block is still open: this one continues it
        if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
            index = obj.get("index")
            if isinstance(index, int) and t.open_block is not None and index == 0:
                obj["index"] = t.open_block
        if kind == "content_block_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict) and delta.get("type") == "text_delta":
                delta["text"] = self._strip(delta.get("text"))
                if not delta["text"]:
                    return None
        if kind == "message_delta":
            self._usage(obj.get("usage"), "input_tokens", "output_tokens")
        return sse(name, obj)

    def _strip(self, piece: Any) -> Any:
        if not isinstance(piece, str) or not piece:
            return piece
        return self._echo.take(piece)

    def _usage(self, usage: Any, prompt: str, completion: str) -> None:
        """The final usage counts the tokens both hosts produced, the prefilled text as output
        (not as prompt), and says how many times the answer moved."""
        if not isinstance(usage, dict):
            return
        pieces = self._before.pieces
        if isinstance(usage.get(completion), int):
            usage[completion] += pieces
        if isinstance(usage.get(prompt), int):
            usage[prompt] = max(0, usage[prompt] - pieces)
        if isinstance(usage.get("total_tokens"), int) and isinstance(usage.get(prompt), int):
            usage["total_tokens"] = usage[prompt] + usage.get(completion, 0)
        usage["crossbar_resumed"] = self._before.resumed

    def finish(self) -> None:
        """The continuation ended whole: a host that never confirmed the echo did not continue."""
        if not self._echo.confirmed:
            raise NotContinued("the host's answer ended before the text it was given came back")
