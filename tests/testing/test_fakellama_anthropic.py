"""The fake serves Anthropic's /v1/messages and /v1/messages/count_tokens as llama-server does:
a message body, or the named event stream, with cache reads counted apart from the input."""

import pytest_twisted
from anthropic import Anthropic
from twisted.internet import reactor
from twisted.internet.threads import deferToThread

from crossbar.testing.fakellama import FakeLlama
from tests.support.fakehelp import client, post, wait

SYSTEM = "You are terse."
FIRST = [{"role": "user", "content": "Name a prime."}]


@pytest_twisted.async_yield_fixture
async def fake():
    fake = FakeLlama(reactor, reply_tokens=6)
    await fake.start()
    yield fake
    await fake.stop()


def chat_of(system, messages):
    return [{"role": "system", "content": system}, *messages]


@pytest_twisted.ensureDeferred
async def test_a_message_answers_with_a_text_block_and_anthropic_usage(fake):
    # Without max_tokens the fake ends its reply itself (end_turn) after reply_tokens.
    body = {"model": "qwen-coder", "system": SYSTEM, "messages": FIRST}
    response, message = await post(fake, "/v1/messages", body)
    assert response.code == 200
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["content"] == [{"type": "text", "text": fake.reply(chat_of(SYSTEM, FIRST))}]
    assert message["stop_reason"] == "end_turn" and message["id"].startswith("chatcmpl-")
    prompt = len(fake.chat_prompt(chat_of(SYSTEM, FIRST)))
    assert message["usage"] == {
        "cache_read_input_tokens": 0,
        "input_tokens": prompt,
        "output_tokens": 6,
    }


@pytest_twisted.ensureDeferred
async def test_a_stream_is_the_named_event_sequence_and_the_next_turn_reads_the_cache(fake):
    body = {"model": "qwen-coder", "max_tokens": 3, "stream": True, "messages": FIRST}
    response = await wait(client().post(fake.url + "/v1/messages", json=body))
    text = (await wait(response.text())).strip()
    blocks = [b.splitlines() for b in text.split("\n\n")]
    names = [lines[0].removeprefix("event: ") for lines in blocks]
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert "[DONE]" not in text
    assert response.headers.getRawHeaders("content-type") == ["text/event-stream"]

    def second_turn():
        with Anthropic(base_url=fake.url, api_key="none", max_retries=0, timeout=10) as c:
            reply = fake.reply(FIRST, max_tokens=3)
            messages = [*FIRST, {"role": "assistant", "content": reply}]
            messages.append({"role": "user", "content": "And another?"})
            with c.messages.stream(model="qwen-coder", max_tokens=4, messages=messages) as s:
                return list(s.text_stream), s.get_final_message()

    pieces, final = await wait(deferToThread(second_turn), 30)
    assert final.stop_reason == "max_tokens" and "".join(pieces) == final.content[0].text
    # The first turn's prompt (and its reply) came from the slot's cache.
    assert final.usage.cache_read_input_tokens >= len(fake.chat_prompt(FIRST))
    assert final.usage.output_tokens == 4


@pytest_twisted.ensureDeferred
async def test_count_tokens_counts_the_system_and_the_messages(fake):
    body = {"model": "qwen-coder", "system": SYSTEM, "messages": FIRST}
    response, counted = await post(fake, "/v1/messages/count_tokens", body)
    assert response.code == 200
    assert counted == {"input_tokens": len(fake.chat_prompt(chat_of(SYSTEM, FIRST)))}
    response, error = await post(fake, "/v1/messages/count_tokens", {"messages": "hi"})
    assert response.code == 400 and "messages" in error["error"]["message"]
