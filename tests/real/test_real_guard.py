"""The context guard at a real slot's limit, counted by the real tokenizer.

The servers run 2 slots of 512 tokens, so a prompt at the limit costs about two seconds of
prefill. Prompts are sized with the host's own count: `word` repeated is one token a word.
"""

import json
import re

import pytest
import pytest_twisted

from tests.real.llamas import Fleet, Llama
from tests.support.harness import MODEL

SLOT = 512


async def words_for(llama: Llama, tokens: int, count_path: str) -> str:
    """A user message that the host's tokenizer counts as exactly `tokens` prompt tokens."""

    async def count(words: int) -> int:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "word " * words}]}
        return (await llama.post(count_path, body))["input_tokens"]

    overhead = await count(0)
    text = "word " * (tokens - overhead)
    assert await count(tokens - overhead) == tokens, "`word` is not one token a word here"
    return text


async def prefilled(fleet: Fleet) -> float:
    """Prompt tokens the servers have processed, from their own /metrics."""
    return sum([await llama.metric("prompt_tokens_total") for llama in fleet.llamas.values()])


@pytest.mark.parametrize(
    ("path", "count_path"),
    [
        ("/v1/chat/completions", "/v1/chat/completions/input_tokens"),
        ("/v1/messages", "/v1/messages/count_tokens"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_prompt_one_token_over_the_slot_is_refused_on_the_real_count_before_any_prefill(
    launch, path, count_path
):
    crossbar, fleet = await launch(ctx=SLOT)
    assert crossbar.parts.hosts.ctx("titan", MODEL) == SLOT  # discovered from /props
    text = await words_for(fleet.llamas["titan"], SLOT + 1, count_path)
    before = await prefilled(fleet)
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    if path == "/v1/messages":
        body["max_tokens"] = 1  # Anthropic requires it; the rule is the prompt's own size
    response = await fleet.within(
        crossbar.client().post(crossbar.url("convo", path), json=body), 30, "the refusal"
    )
    answer = json.loads(await fleet.within(response.content(), 30, "the refusal's body"))
    assert response.code == 400, answer
    if path == "/v1/messages":
        assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    else:
        assert answer["error"]["code"] == "context_length_exceeded"
    message = answer["error"]["message"]
    needs = re.search(r"needs (\d+) tokens", message)
    assert needs is not None, message
    assert int(needs[1]) == SLOT + 1, message  # the real count, exactly
    assert f"than fit the {SLOT}-token context" in message, message
    assert crossbar.parts.guard.exact_counts == 1 and crossbar.parts.guard.refused == 1
    assert await prefilled(fleet) == before  # nothing reached either host's slots


@pytest_twisted.ensureDeferred
async def test_a_prompt_one_token_under_the_slot_is_served_by_the_real_host(launch):
    crossbar, fleet = await launch(ctx=SLOT)
    count_path = "/v1/chat/completions/input_tokens"
    text = await words_for(fleet.llamas["titan"], SLOT - 1, count_path)
    response, answer = await fleet.within(
        crossbar.chat("convo", [{"role": "user", "content": text}], max_tokens=1),
        60,
        "a prompt that fills the slot",
    )
    assert response.code == 200, answer
    assert answer["usage"]["prompt_tokens"] == SLOT - 1  # what the guard counted, prefilled
    assert crossbar.parts.guard.exact_counts == 1 and crossbar.parts.guard.refused == 0
