"""Conversations through crossbar in each client dialect, turn by turn, with official clients.

Each `say` sends the whole conversation so far plus one new user line, as a chat client does,
and returns what the turn showed: the host that served it and the prompt tokens the host read
from its cache. The sync SDK clients run in a thread; every one has a short timeout, so a dead
server never leaves a thread blocked for long.
"""

from __future__ import annotations

from typing import Any, Protocol

import treq
from attrs import define, field, frozen
from twisted.internet.threads import deferToThread

from tests.support.harness import MODEL, Crossbar

CLIENT_TIMEOUT = 30.0  # seconds, for every SDK call
CLAUDE = "claude-sonnet-4-5-20250929"  # the model name Claude Code sends
SYSTEM = "You are a terse assistant. Answer in one short sentence."
REPLY_TOKENS = 12
# Gemma 3 attends through a sliding window, so llama-server cannot reuse a cached prompt to its
# very end: it restores the context checkpoint it took 4 tokens before the end of the last prompt
# (tools/server/server-context.cpp, `checkpoint_offsets`). The next turn on the same host reads
# all of the last prompt from its cache but those last few tokens (5 seen); another host reads
# at most the start the two conversations share (the system prompt).
CHECKPOINT_SLACK = 8


@frozen
class Turn:
    """What one turn showed: host, reply, prompt tokens in all, and those read from cache."""

    host: str
    text: str
    prompt: int
    cached: int


def read_from_cache(before: Turn, now: Turn) -> bool:
    """Whether turn `now` found the prompt of turn `before` in its host's cache."""
    return now.cached > before.cached and now.cached >= before.prompt - CHECKPOINT_SLACK


class Conversation(Protocol):
    async def say(self, text: str) -> Turn: ...


def openai_client(base_url: str) -> Any:
    """The official OpenAI client on `base_url`, with no retries and a short timeout."""
    from openai import OpenAI

    return OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT)


@define
class OpenAIChat:
    """/v1/chat/completions with the OpenAI client, streamed or not."""

    crossbar: Crossbar
    opening: str
    stream: bool
    messages: list[dict] = field(factory=list)

    async def say(self, text: str) -> Turn:
        if not self.messages:
            self.messages.append({"role": "system", "content": SYSTEM})
            text = f"{self.opening} {text}"
        self.messages.append({"role": "user", "content": text})
        turn = await deferToThread(self._send)
        self.messages.append({"role": "assistant", "content": turn.text})
        return turn

    def _send(self) -> Turn:
        with openai_client(self.crossbar.url("convo", "/v1")) as client:
            create = client.chat.completions.with_raw_response.create
            raw = create(
                model=MODEL,
                messages=self.messages,
                max_tokens=REPLY_TOKENS,
                temperature=0,
                stream=self.stream,
                **({"stream_options": {"include_usage": True}} if self.stream else {}),
            )
            host = raw.headers["x-crossbar-host"]
            if not self.stream:
                answer = raw.parse()
                return _openai_turn(host, answer.choices[0].message.content or "", answer.usage)
            text, usage = "", None
            for chunk in raw.parse():
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                usage = chunk.usage or usage
            return _openai_turn(host, text, usage)


def _openai_turn(host: str, text: str, usage: Any) -> Turn:
    assert usage is not None, "the host sent no usage"
    details = usage.prompt_tokens_details
    return Turn(host, text, usage.prompt_tokens, details.cached_tokens if details else 0)


@define
class AnthropicMessages:
    """Anthropic's /v1/messages with the official Anthropic client, streamed or not, naming
    `model` (Claude Code names a Claude model, which the route's alias serves)."""

    crossbar: Crossbar
    opening: str
    stream: bool = False
    model: str = MODEL
    messages: list[dict] = field(factory=list)

    async def say(self, text: str) -> Turn:
        if not self.messages:
            text = f"{self.opening} {text}"
        self.messages.append({"role": "user", "content": text})
        turn = await deferToThread(self._send)
        self.messages.append({"role": "assistant", "content": turn.text})
        return turn

    def _send(self) -> Turn:
        from anthropic import Anthropic, NotFoundError

        base = self.crossbar.url("convo", "")
        with Anthropic(
            base_url=base, api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT
        ) as client:
            args = {
                "model": self.model,
                "system": SYSTEM,
                "messages": self.messages,
                "max_tokens": REPLY_TOKENS,
                "extra_body": {"temperature": 0},  # this SDK no longer takes it as a keyword
            }
            try:
                if self.stream:
                    with client.messages.stream(**args) as s:
                        streamed = "".join(s.text_stream)
                        message, headers = s.get_final_message(), s.response.headers
                else:
                    raw = client.messages.with_raw_response.create(**args)
                    message, headers = raw.parse(), raw.headers
            except NotFoundError as e:
                # Never a pass: without the host's /v1/messages this test shows nothing.
                host = e.response.headers.get("x-crossbar-host")
                who = f"llama-server {host}" if host else "crossbar"
                raise AssertionError(f"{who} does not serve /v1/messages: {e}") from e
        text = "".join(block.text for block in message.content if block.type == "text")
        if self.stream:
            assert streamed == text, (streamed, text)
        # Anthropic counts cache reads apart from input_tokens.
        cached = message.usage.cache_read_input_tokens or 0
        return Turn(headers["x-crossbar-host"], text, message.usage.input_tokens + cached, cached)


@define
class RawCompletion:
    """llama.cpp's own /completion with a raw prompt that grows by each exchange.

    crossbar knows a raw-prompt conversation by its first `fingerprint_chars` characters: the
    route's config sets those below the length of `opening`, as an operator would."""

    crossbar: Crossbar
    opening: str
    prompt: str = ""

    async def say(self, text: str) -> Turn:
        self.prompt = (self.prompt or self.opening) + f"\nUser: {text}\nAssistant:"
        body = {
            "prompt": self.prompt,
            "n_predict": REPLY_TOKENS,
            "temperature": 0,
            "cache_prompt": True,
        }
        response = await self.crossbar.client().post(
            self.crossbar.url("convo", "/completion"), json=body, timeout=CLIENT_TIMEOUT
        )
        answer = await treq.json_content(response)
        assert response.code == 200, answer
        self.prompt += answer["content"]
        timings = answer["timings"]
        host = response.headers.getRawHeaders("X-Crossbar-Host")[0]
        return Turn(
            host, answer["content"], timings["cache_n"] + timings["prompt_n"], timings["cache_n"]
        )
