"""Tool calls in the fake llama-server, so that real coding agents can run a session on it.

The fake has no model to decide on a tool, so the prompt scripts it: when the last message is
the user's (not a tool result; system notes after it aside) and its text has a line
`CALL <name> <json arguments>` naming a tool the request offers, the reply is that one call
instead of text, and generation ends there (EOS). The agent runs the tool and sends its
result; that request gets an ordinary text reply.

The call streams as llama-server streams one (tools/server, checked against server-task.cpp and
server-chat.cpp): OpenAI chat `delta.tool_calls` (id, type and name first, then argument
pieces) and finish reason `tool_calls`; Anthropic a `tool_use` content block (no `input` in its
start) fed by `input_json_delta` pieces, stop reason `tool_use`; Responses a `function_call`
output item (`fc_` id, `call_` call id) fed by `response.function_call_arguments.delta`, then
`response.output_item.done` and `response.completed` with usage. Argument pieces are tokens.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from attrs import frozen

from crossbar.testing.fakeanthropic import AnthropicFormat
from crossbar.testing.fakeformat import (
    ChatFormat,
    Event,
    Format,
    Job,
    Outcome,
    ResponsesFormat,
    timings,
    usage,
)
from crossbar.testing.faketokens import content_text

DIRECTIVE = re.compile(r"^CALL (\w+) (\{.*\})[ \t]*$", re.M)


@frozen
class ToolCall:
    """The one call a reply makes: `arguments` is JSON text, as the APIs carry it."""

    name: str
    arguments: str
    id: str


def planned_call(kind: str, body: dict[str, Any]) -> ToolCall | None:
    """The call the request's last user message scripts, if it names an offered tool."""
    text = _last_user_text(kind, body)
    if not text:
        return None
    if text.startswith('"'):  # OpenCode's `run` sends the message as a JSON string literal
        try:
            text = str(json.loads(text, strict=False))
        except ValueError:
            pass
    offered = _tool_names(body.get("tools"))
    for match in reversed(list(DIRECTIVE.finditer(text))):
        name, arguments = match.group(1), match.group(2)
        if name not in offered:
            continue
        try:
            json.loads(arguments)
        except ValueError:
            continue
        return ToolCall(name, arguments, secrets.token_hex(16))
    return None


def _last_user_text(kind: str, body: dict[str, Any]) -> str | None:
    if kind in ("chat", "anthropic"):
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        last = _last_turn(messages)
        content = last.get("content")
        if last.get("role") != "user":
            return None
        if isinstance(content, list):
            if any(isinstance(p, dict) and p.get("type") == "tool_result" for p in content):
                return None
            content = [p for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return content_text(content)
    if kind == "responses":
        given = body.get("input")
        if isinstance(given, str):
            return given
        if isinstance(given, list) and _last_turn(given).get("role") == "user":
            return content_text(_last_turn(given).get("content"))
    return None


def _last_turn(messages: list[Any]) -> dict[str, Any]:
    """The last message that is not a system or developer note (Claude Code sends its
    environment as a system message after the user's)."""
    for message in reversed(messages):
        if not isinstance(message, dict):
            return {}
        if message.get("role") not in ("system", "developer"):
            return message
    return {}


def _tool_names(tools: Any) -> set[str]:
    names = set()
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        name = function.get("name") if isinstance(function, dict) else tool.get("name")
        if isinstance(name, str):
            names.add(name)
    return names


class ChatToolFormat(ChatFormat):
    """OpenAI chat: the call in `delta.tool_calls`, finish reason `tool_calls`."""

    def token(self, job: Job, piece: str, token: int, i: int) -> list[Event]:
        call = _call(job)
        entry: dict[str, Any] = {"index": 0, "function": {"arguments": piece}}
        if i == 0:
            entry = {"index": 0, "id": call.id, "type": "function"}
            entry["function"] = {"name": call.name, "arguments": piece}
        delta = {"tool_calls": [entry]}
        return [(self._chunk(job, [{"finish_reason": None, "index": 0, "delta": delta}]), None)]

    def end(self, job: Job, o: Outcome) -> list[Event]:
        reason = "length" if o.stopped_by_limit else "tool_calls"
        chunks = [self._chunk(job, [{"finish_reason": reason, "index": 0, "delta": {}}])]
        if job.include_usage:
            chunks.append(self._chunk(job, []) | {"usage": usage(job, o)})
        chunks[-1]["timings"] = timings(o)
        return [(chunk, None) for chunk in chunks]

    def body(self, job: Job, o: Outcome) -> dict[str, Any]:
        call = _call(job)
        answer = super().body(job, o)
        function = {"name": call.name, "arguments": o.text}
        message = {"role": "assistant", "content": None}
        message["tool_calls"] = [{"type": "function", "function": function, "id": call.id}]
        answer["choices"][0]["message"] = message
        answer["choices"][0]["finish_reason"] = "length" if o.stopped_by_limit else "tool_calls"
        return answer


class AnthropicToolFormat(AnthropicFormat):
    """Anthropic: one `tool_use` block, stop reason `tool_use`."""

    def token(self, job: Job, piece: str, token: int, i: int) -> list[Event]:
        call = _call(job)
        events: list[Event] = []
        if i == 0:
            block = {"type": "tool_use", "id": call.id, "name": call.name}
            start = {"type": "content_block_start", "index": 0, "content_block": block}
            events.append((start, "content_block_start"))
        delta = {"type": "input_json_delta", "partial_json": piece}
        events.append(
            ({"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta")
        )
        return events

    def end(self, job: Job, o: Outcome) -> list[Event]:
        events = super().end(job, o)
        for data, _ in events:
            if data["type"] == "message_delta" and not o.stopped_by_limit:
                data["delta"]["stop_reason"] = "tool_use"
        return events

    def body(self, job: Job, o: Outcome) -> dict[str, Any]:
        call = _call(job)
        answer = super().body(job, o)
        try:
            given = json.loads(o.text)
        except ValueError:
            given = {}  # cut short by max_tokens: llama-server sends an empty input then
        answer["content"] = [{"type": "tool_use", "id": call.id, "name": call.name, "input": given}]
        if not o.stopped_by_limit:
            answer["stop_reason"] = "tool_use"
        return answer


class ResponsesToolFormat(ResponsesFormat):
    """Responses: one `function_call` output item."""

    def _item(self, job: Job, arguments: str, status: str) -> dict[str, Any]:
        call = _call(job)
        return {
            "id": "fc_" + call.id,
            "type": "function_call",
            "status": status,
            "arguments": arguments,
            "call_id": "call_" + call.id,
            "name": call.name,
        }

    def begin(self, job: Job) -> list[Event]:
        opened = self._response(job, "in_progress", [])
        return [
            self._event(job, "response.created", response=opened),
            self._event(job, "response.in_progress", response=opened),
        ]

    def token(self, job: Job, piece: str, token: int, i: int) -> list[Event]:
        events = []
        if i == 0:
            item = self._item(job, "", "in_progress")
            events.append(self._event(job, "response.output_item.added", output_index=0, item=item))
        # output_index is not in llama-server's delta event; the OpenAI SDK needs it.
        where = {"item_id": "fc_" + _call(job).id, "output_index": 0}
        events.append(
            self._event(job, "response.function_call_arguments.delta", **where, delta=piece)
        )
        return events

    def end(self, job: Job, o: Outcome) -> list[Event]:
        item = self._item(job, o.text, "completed")
        return [
            self._event(job, "response.output_item.done", output_index=0, item=item),
            self._event(job, "response.completed", response=self.body(job, o), timings=timings(o)),
        ]

    def body(self, job: Job, o: Outcome) -> dict[str, Any]:
        return self._response(job, "completed", [self._item(job, o.text, "completed")]) | {
            "completed_at": job.created,
            "usage": self._usage(job, o),
            "timings": timings(o),
        }


TOOL_FORMATS: dict[str, Format] = {
    "chat": ChatToolFormat(),
    "anthropic": AnthropicToolFormat(),
    "responses": ResponsesToolFormat(),
}


def _call(job: Job) -> ToolCall:
    assert job.tool_call is not None, "a tool format serves only jobs that make a call"
    return job.tool_call  # type: ignore[no-any-return]
