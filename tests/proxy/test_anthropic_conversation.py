"""Whole conversations through Anthropic's own SDK, as Claude Code holds them: each keeps one
host, and each turn reads more of its prompt from that host's cache."""

from __future__ import annotations

import itertools
from typing import Any

import anthropic
import pytest
import pytest_twisted
from attrs import define, field
from twisted.internet.threads import deferToThread

from tests.support.harness import MODEL, Crossbar, start_fakes, wait

CLAUDE = "claude-sonnet-4-5-20250929"
SYSTEM = "You are Claude Code, working in a repository."
pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")


@define
class Turn:
    host: str
    text: str
    input_tokens: int  # the part of the prompt the host did not have cached
    cache_read: int


@define
class Conversation:
    """One Claude-Code-like conversation: the system prompt, then growing messages."""

    crossbar: Crossbar
    stream: bool
    messages: list[dict[str, Any]] = field(factory=list)

    async def say(self, text: str) -> Turn:
        self.messages.append({"role": "user", "content": text})
        turn = await wait(deferToThread(self._send), 60)
        self.messages.append({"role": "assistant", "content": turn.text})
        return turn

    def _send(self) -> Turn:
        with anthropic.Anthropic(
            base_url=self.crossbar.url("convo", ""), api_key="none", max_retries=0, timeout=30
        ) as client:
            args = {"model": CLAUDE, "max_tokens": 12, "system": SYSTEM, "messages": self.messages}
            if self.stream:
                with client.messages.stream(**args) as s:
                    text = "".join(s.text_stream)
                    message, headers = s.get_final_message(), s.response.headers
                assert text == message.content[0].text
            else:
                raw = client.messages.with_raw_response.create(**args)
                message, headers = raw.parse(), raw.headers
        usage = message.usage
        return Turn(
            headers["x-crossbar-host"],
            message.content[0].text,
            usage.input_tokens,
            usage.cache_read_input_tokens or 0,
        )


ROUTES = {"convo": {"hosts": ["titan", "atlas"], "aliases": {"claude-*": MODEL}}}


@pytest.mark.parametrize("stream", [False, True], ids=["messages", "streamed"])
@pytest_twisted.ensureDeferred
async def test_each_conversation_keeps_its_host_and_reads_more_from_its_cache_each_turn(
    stream, launch
):
    crossbar = await launch(await start_fakes("titan", "atlas"), ROUTES)
    convos = [Conversation(crossbar, stream), Conversation(crossbar, stream)]
    turns: list[list[Turn]] = [[], []]
    schedule = [(0, "Read parser.py."), (1, "Read lexer.py."), (0, "Now refactor it.")]
    schedule += [(1, "Add a test."), (0, "Run the tests."), (1, "Commit it.")]
    for n, text in schedule:
        turns[n].append(await convos[n].say(f"Task {n}: {text}"))
    homes = [{t.host for t in seen} for seen in turns]
    assert all(len(h) == 1 for h in homes) and homes[0] != homes[1], turns
    for seen in turns:
        assert seen[0].cache_read == 0
        for before, now in itertools.pairwise(seen):
            # The whole previous prompt and reply came from the cache; only the new turn
            # was read anew.
            assert now.cache_read > before.cache_read + before.input_tokens, seen
    assert len(crossbar.parts.table.snapshot("convo")) == 2  # a lease per conversation
    hits = crossbar.parts.metrics.cache_hit_ratios()["convo"]
    assert hits > 0.5  # crossbar read the same usage the SDK did
