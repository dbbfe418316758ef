"""Talking to crossbar the way a client does: two short conversations, one line per turn.

Plain urllib with no proxy from the environment (an `http_proxy` must not swallow 127.0.0.1).
Conversation A names itself with `X-Crossbar-Conversation` and reads JSON answers; conversation B
sends no session header, so crossbar fingerprints its opening messages, and reads SSE.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.message import Message
from typing import Any

from crossbar.demo.plan import DemoError, Plan

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
TIMEOUT = 30.0
REPLY_TOKENS = 12

SYSTEM = (
    "You are the assistant of a small engineering team. Answer in two short sentences, plainly, "
    "without lists. The team runs language models on a few GPU machines behind a proxy called "
    "crossbar, which keeps every conversation on the machine whose prompt cache already holds "
    "it, so that a long conversation is never processed again from the start. When you explain "
    "something, name the part of the system it belongs to, say what it costs, and say what the "
    "operator can do about it. If you do not know, say so and suggest where to look: the "
    "operator guide, the client guide, or the architecture notes in the docs directory."
)


@dataclass
class Answer:
    """One HTTP answer, whatever its status."""

    status: int
    headers: Message
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def call(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> Answer:
    """One request; a connection failure raises OSError (urllib's URLError is one)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with _OPENER.open(request, timeout=TIMEOUT) as response:
            return Answer(response.status, response.headers, response.read())
    except urllib.error.HTTPError as e:
        with e:
            return Answer(e.code, e.headers, e.read())


def _events(url: str, body: Any, headers: dict[str, str]) -> tuple[Answer, Iterator[Any]]:
    """POST and read a server-sent event stream: the answer's head, then each `data:` object."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    for name, value in {**headers, "Content-Type": "application/json"}.items():
        request.add_header(name, value)
    try:
        response = _OPENER.open(request, timeout=TIMEOUT)
    except urllib.error.HTTPError as e:
        with e:
            return Answer(e.code, e.headers, e.read()), iter(())

    def events() -> Iterator[Any]:
        with response:
            for line in response:
                payload = line.strip()
                if payload.startswith(b"data:") and payload[5:].strip() != b"[DONE]":
                    yield json.loads(payload[5:])

    return Answer(response.status, response.headers, b""), events()


@dataclass(frozen=True)
class Turn:
    """What one turn of a conversation showed."""

    conversation: str
    number: int
    host: str
    lease: str
    prompt: int
    cached: int
    prefill_ms: float | None
    seconds: float

    def line(self) -> str:
        prefill = f"{self.prefill_ms:5.0f} ms" if self.prefill_ms is not None else "    ?   "
        return (
            f"  {self.conversation}  turn {self.number}  host {self.host:<8} "
            f"lease {self.lease:<7} prompt {self.prompt:4d} tokens, {self.cached:4d} cached, "
            f"prefill {prefill}  ({self.seconds:.2f} s)"
        )


@dataclass
class Conversation:
    """A scripted conversation: its questions, and the messages so far."""

    label: str
    questions: list[str]
    session: str | None = None  # sent as X-Crossbar-Conversation when set
    stream: bool = False
    messages: list[dict[str, str]] = field(default_factory=list)

    def describe(self) -> str:
        how = (
            f"X-Crossbar-Conversation: {self.session}"
            if self.session
            else "no session header (crossbar fingerprints its opening messages)"
        )
        return f"conversation {self.label}: {how}; {'streamed (SSE)' if self.stream else 'JSON'}"


def conversations() -> list[Conversation]:
    """Two fresh conversations; a run tag keeps their leases apart from earlier runs'."""
    tag = os.urandom(3).hex()
    a = Conversation(
        "A",
        [
            "Why does crossbar keep a conversation on one host?",
            "What happens when that host goes down?",
            "And when a new, faster host is added?",
        ],
        session=f"demo-{tag}-a",
    )
    b = Conversation(
        "B",
        [
            f"(demo run {tag}) How should an agent pick its base URL?",
            "Which header names a conversation?",
            "What does Retry-After tell my client?",
        ],
        stream=True,
    )
    for c in (a, b):
        c.messages.append({"role": "system", "content": SYSTEM})
    return [a, b]


def _tokens(obj: Any) -> tuple[int, int, float | None] | None:
    """(prompt, cached, prefill ms) from a body's or chunk's `usage` and `timings`."""
    if not isinstance(obj, dict) or not ("usage" in obj or "timings" in obj):
        return None
    usage, timings = obj.get("usage") or {}, obj.get("timings") or {}
    prompt = usage.get("prompt_tokens", 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    if "cache_n" in timings:
        cached = timings["cache_n"]
        prompt = timings["cache_n"] + timings.get("prompt_n", 0)
    return prompt, cached, timings.get("prompt_ms")


def take_turn(plan: Plan, conversation: Conversation, number: int) -> Turn:
    """Send the next question; remember the reply as the assistant message of the next turn."""
    question = conversation.questions[number - 1]
    conversation.messages.append({"role": "user", "content": question})
    body = {
        "model": plan.model,
        "messages": conversation.messages,
        "max_tokens": REPLY_TOKENS,
        "stream": conversation.stream,
    }
    headers = {"X-Crossbar-Conversation": conversation.session} if conversation.session else {}
    url = plan.route_url("/v1/chat/completions")
    started = time.monotonic()
    text, tokens = "", None
    if conversation.stream:
        answer, events = _events(url, body, headers)
        for event in events:
            if isinstance(event, dict) and "error" in event:
                raise DemoError(f"conversation {conversation.label}: stream broke: {event}")
            for choice in event.get("choices") or []:
                text += (choice.get("delta") or {}).get("content") or ""
            tokens = _tokens(event) or tokens
    else:
        answer = call("POST", url, body, headers)
        data = answer.json()
        if answer.status == 200 and isinstance(data, dict):
            text = data["choices"][0]["message"]["content"]
            tokens = _tokens(data)
    seconds = time.monotonic() - started
    if answer.status != 200:
        detail = answer.body.decode(errors="replace")[:300]
        raise DemoError(
            f"conversation {conversation.label}, turn {number}: HTTP {answer.status}: {detail}"
        )
    conversation.messages.append({"role": "assistant", "content": text})
    prompt, cached, prefill = tokens or (0, 0, None)
    return Turn(
        conversation=conversation.label,
        number=number,
        host=answer.headers.get("X-Crossbar-Host", "?"),
        lease=answer.headers.get("X-Crossbar-Lease", "?"),
        prompt=prompt,
        cached=cached,
        prefill_ms=prefill,
        seconds=seconds,
    )


def drive(plan: Plan, chats: list[Conversation], say: Callable[[str], None]) -> list[Turn]:
    """Every conversation's turns, interleaved (A1, B1, A2, ...), one printed line per turn."""
    for chat in chats:
        say(chat.describe())
    turns = []
    for number in range(1, max(len(c.questions) for c in chats) + 1):
        for chat in chats:
            if number <= len(chat.questions):
                turn = take_turn(plan, chat, number)
                say(turn.line())
                turns.append(turn)
    return turns
