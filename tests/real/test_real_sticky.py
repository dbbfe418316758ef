"""Conversations stay on their real llama-server, whose prompt cache then serves each turn.

In every dialect crossbar proxies, two conversations take turns against two real llama-servers:
each keeps its host, the two use both hosts, and each turn the host reads the previous turn's
prompt from its cache.
"""

import itertools

import pytest
import pytest_twisted

from tests.real.dialogue import (
    CLAUDE,
    AnthropicMessages,
    OpenAIChat,
    RawCompletion,
    read_from_cache,
)
from tests.support.harness import MODEL

# The SDK warns about old Claude model names; the route's alias makes any name right.
pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")

PREAMBLE = (
    " A transcript between a curious user and a terse assistant, who answers every question"
    " in one short sentence, never repeats the question, and never adds a greeting or a list."
    " The assistant knows colours, fruit, rivers, cities, tools and animals."
)  # the raw prompts' common start, longer than fingerprint_chars

DIALECTS = {
    "chat": lambda crossbar, topic: OpenAIChat(crossbar, f"Let us talk about {topic}.", False),
    "streamed chat": lambda crossbar, topic: OpenAIChat(
        crossbar, f"Let us talk about {topic}.", True
    ),
    "/completion": lambda crossbar, topic: RawCompletion(crossbar, f"Topic: {topic}.{PREAMBLE}"),
    "anthropic messages": lambda crossbar, topic: AnthropicMessages(
        crossbar, f"Let us talk about {topic}."
    ),
    # As Claude Code talks: streamed, naming a Claude model that the route's alias serves.
    "streamed anthropic messages as claude": lambda crossbar, topic: AnthropicMessages(
        crossbar, f"Let us talk about {topic}.", stream=True, model=CLAUDE
    ),
}
# Which conversation speaks when: two turns in a row first (a host chosen afresh each turn
# would alternate, as the chooser balances leases), then the two take turns.
SCHEDULE = [
    (0, "Name one."),
    (0, "Name another one."),
    (1, "Name one."),
    (1, "Name another one."),
    (0, "And a third?"),
    (1, "And a third?"),
]


@pytest.mark.parametrize("dialect", list(DIALECTS))
@pytest_twisted.ensureDeferred
async def test_each_conversation_keeps_its_host_and_reads_its_last_turn_from_the_real_cache(
    launch, dialect
):
    crossbar, fleet = await launch(
        server={"fingerprint_chars": 100}, route={"aliases": {"claude-*": MODEL}}
    )
    start = DIALECTS[dialect]
    convos = [start(crossbar, "colours"), start(crossbar, "fruit")]
    turns: list[list] = [[], []]
    for n, question in SCHEDULE:
        turns[n].append(await fleet.within(convos[n].say(question), 60, f"a {dialect} turn"))
    homes = [{t.host for t in seen} for seen in turns]
    assert homes[0] != homes[1] and all(len(h) == 1 for h in homes), turns
    for seen in turns:
        assert all(t.text for t in seen), seen
        assert all(read_from_cache(before, now) for before, now in itertools.pairwise(seen)), seen
    assert len(crossbar.parts.table.snapshot("convo")) == 2  # one lease a conversation
    assert crossbar.parts.guard.refused == 0
