"""The context guard through crossbar: never stricter than llama-server, in the caller's dialect.

A 32k slot as in issue 19: Claude Code's first request (a 4k-token prompt asking for 32000
tokens) is served, as llama-server serves it; a prompt that really does not fit is refused with
400 context_length_exceeded before anything reaches a host, in OpenAI's or Anthropic's shape.
"""

import json

import pytest_twisted

from tests.support.harness import MODEL, start_fakes, wait

SLOT = 32_768
INFERENCE = ("/v1/chat/completions", "/v1/messages")


def words(n: int) -> str:
    return " ".join(["word"] * n)


async def post(crossbar, path, body):
    response = await wait(
        crossbar.client().post(crossbar.url("convo", path), data=json.dumps(body).encode()), 30
    )
    return response, await wait(response.content(), 30)


def requests(fake) -> int:
    return sum(fake.counters.requests[path] for path in INFERENCE)


@pytest_twisted.ensureDeferred
async def test_claude_codes_first_request_is_served_with_its_32000_token_reply_limit(launch):
    fakes = await start_fakes("titan", ctx=SLOT, eos_after=12)
    crossbar = await launch(fakes, {"convo": {"hosts": ["titan"]}}, ctx=SLOT)
    fake = fakes["titan"]
    body = {
        "model": MODEL,
        "max_tokens": 32_000,
        "stream": True,
        "system": [{"type": "text", "text": words(3000)}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": words(1100)}]}],
    }
    response, raw = await post(crossbar, "/v1/messages", body)
    assert response.code == 200, raw
    assert b"event: message_stop" in raw and b'"end_turn"' in raw
    (done,) = fake.counters.completions
    assert 4000 < done.prompt_tokens < 4200  # the prompt, about 4.1k tokens
    assert crossbar.parts.guard.refused == 0


@pytest_twisted.ensureDeferred
async def test_a_prompt_over_the_slot_is_refused_in_each_dialect_before_anything_goes_upstream(
    launch,
):
    fakes = await start_fakes("titan", ctx=SLOT)
    crossbar = await launch(fakes, {"convo": {"hosts": ["titan"]}}, ctx=SLOT)
    fake = fakes["titan"]
    over = [{"role": "user", "content": words(SLOT + 10)}]
    response, raw = await post(
        crossbar, "/v1/chat/completions", {"model": MODEL, "messages": over, "max_tokens": 1}
    )
    error = json.loads(raw)["error"]
    assert response.code == 400
    assert (error["type"], error["code"]) == (
        "invalid_request_error",
        "context_length_exceeded",
    )
    assert f"than fit the {SLOT}-token context" in error["message"]

    response, raw = await post(
        crossbar, "/v1/messages", {"model": MODEL, "messages": over, "max_tokens": 1}
    )
    answer = json.loads(raw)
    assert response.code == 400
    assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    assert f"than fit the {SLOT}-token context" in answer["error"]["message"]

    assert requests(fake) == 0  # nothing was prefilled
    assert fake.counters.requests["/v1/chat/completions/input_tokens"] == 1
    assert fake.counters.requests["/v1/messages/count_tokens"] == 1
    assert crossbar.parts.guard.refused == 2
