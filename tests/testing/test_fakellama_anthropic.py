"""The fake serves Anthropic's /v1/messages and /v1/messages/count_tokens as llama-server does:
a message body, or the named event stream, with cache reads counted apart from the input."""

import pytest_twisted
from anthropic import Anthropic
from twisted.internet import reactor
from twisted.internet.threads import deferToThread

from crossbar.testing.fakellama import FakeLlama
from tests.support.fakehelp import client, events, post, wait

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


PREFIX = "The smallest prime is"
CONTINUED = [*FIRST, {"role": "assistant", "content": PREFIX}]


@pytest_twisted.ensureDeferred
async def test_a_trailing_assistant_message_is_continued_and_echoed_as_in_chat(fake):
    body = {"model": "qwen-coder", "max_tokens": 4, "messages": CONTINUED}
    _, message = await post(fake, "/v1/messages", body)
    new = fake.reply(CONTINUED, max_tokens=4)
    assert message["content"] == [{"type": "text", "text": PREFIX + new}]
    # The prefix is prompt, not output: input_tokens counts it, output_tokens does not.
    usage = message["usage"]
    assert usage["output_tokens"] == 4
    prompt = len(fake.chat_prompt(FIRST)) + len(fake.tokenizer.tokenize(PREFIX))
    assert usage["cache_read_input_tokens"] + usage["input_tokens"] == prompt
    _, counted = await post(fake, "/v1/messages/count_tokens", {"messages": CONTINUED})
    assert counted == {"input_tokens": prompt}

    _, text = await post(fake, "/v1/messages", {**body, "stream": True})
    streamed = events(text)
    (start,) = [e for e in streamed if e["type"] == "content_block_start"]
    assert start["content_block"] == {"type": "text", "text": ""}  # the block starts empty
    deltas = [e["delta"]["text"] for e in streamed if e["type"] == "content_block_delta"]
    # The first delta is the prefix and the first new token; the rest are new tokens.
    assert deltas[0] == PREFIX + fake.reply(CONTINUED, max_tokens=1)
    assert len(deltas) == 4 and "".join(deltas) == PREFIX + new
    (end,) = [e for e in streamed if e["type"] == "message_delta"]
    assert end["usage"] == {"output_tokens": 4}


@pytest_twisted.ensureDeferred
async def test_a_continued_messages_text_blocks_are_joined_by_a_blank_line(fake):
    blocks = [{"type": "text", "text": "The smallest"}, {"type": "text", "text": "prime is"}]
    messages = [*FIRST, {"role": "assistant", "content": blocks}]
    body = {"model": "qwen-coder", "max_tokens": 2, "messages": messages}
    _, message = await post(fake, "/v1/messages", body)
    assert message["content"][0]["text"].startswith("The smallest\n\nprime is")


@pytest_twisted.ensureDeferred
async def test_without_prefill_the_trailing_assistant_message_is_a_finished_turn():
    fake = FakeLlama(reactor, prefill_assistant=False)
    await fake.start()
    try:
        body = {"model": "qwen-coder", "max_tokens": 4, "messages": CONTINUED}
        _, message = await post(fake, "/v1/messages", body)
        text = message["content"][0]["text"]
        assert text == fake.counters.completions[-1].text and not text.startswith(PREFIX)
        usage = message["usage"]
        assert usage["input_tokens"] == len(fake.chat_prompt(CONTINUED))  # a closed turn
    finally:
        await fake.stop()
