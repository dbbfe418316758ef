"""The official openai client talks to the fake, streaming and not, and Responses chain; a
trailing assistant message is continued, as llama-server does."""

import pytest
import pytest_twisted
import treq
from openai import OpenAI
from twisted.internet import reactor
from twisted.internet.threads import deferToThread
from twisted.web.client import ResponseFailed

from crossbar.testing.fakellama import FakeLlama
from tests.support.fakehelp import client, events, post, user, wait

MESSAGES = [{"role": "system", "content": "You are terse."}, *user("Name a prime.")]


@pytest_twisted.async_yield_fixture
async def fake():
    fake = FakeLlama(reactor, tokens_per_second=0)
    await fake.start()
    yield fake
    await fake.stop()


def in_thread(fake, use):
    """Run `use(client)` with a sync openai client in a thread, so the reactor keeps serving."""

    def run():
        with OpenAI(base_url=fake.url + "/v1", api_key="none", max_retries=0, timeout=10) as c:
            return use(c)

    return wait(deferToThread(run), 30)


@pytest_twisted.ensureDeferred
async def test_the_openai_client_gets_the_deterministic_chat_reply(fake):
    reply = await in_thread(
        fake, lambda c: c.chat.completions.create(model="qwen-coder", messages=MESSAGES)
    )
    assert reply.choices[0].message.content == fake.reply(MESSAGES)
    assert reply.model == "qwen-coder"
    assert reply.usage.prompt_tokens == len(fake.chat_prompt(MESSAGES))
    assert reply.usage.completion_tokens == fake.config.reply_tokens


@pytest_twisted.ensureDeferred
async def test_the_openai_client_streams_the_same_text(fake):
    def stream(c):
        chunks = list(
            c.chat.completions.create(
                model="qwen-coder",
                messages=MESSAGES,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        return text, chunks[-1].usage

    text, usage = await in_thread(fake, stream)
    assert text == fake.reply(MESSAGES) == fake.counters.completions[-1].text
    assert usage.completion_tokens == fake.config.reply_tokens


@pytest_twisted.ensureDeferred
async def test_the_openai_client_uses_completions_and_responses(fake):
    text = await in_thread(
        fake,
        lambda c: c.completions.create(model="m", prompt="Once upon", max_tokens=5).choices[0].text,
    )
    assert text == fake.reply(prompt="Once upon", max_tokens=5)

    def respond(c):
        plain = c.responses.create(model="m", instructions="Be brief.", input="Hi")
        streamed = c.responses.create(model="m", input="Hi again", stream=True)
        deltas = [e.delta for e in streamed if e.type == "response.output_text.delta"]
        return plain, "".join(deltas)

    plain, streamed = await in_thread(fake, respond)
    system = {"role": "system", "content": "Be brief."}
    assert plain.output_text == fake.reply([system, *user("Hi")])
    assert plain.id.startswith("resp_") and plain.usage.input_tokens > 0
    assert streamed == fake.reply(user("Hi again"))


@pytest_twisted.ensureDeferred
async def test_like_llama_server_the_fake_refuses_a_previous_response_id(fake):
    response, body = await post(
        fake, "/v1/responses", {"previous_response_id": "resp_x", "input": "?", "model": "m"}
    )
    assert response.code == 400
    assert body["error"]["message"] == "llama.cpp does not support 'previous_response_id'."


@pytest_twisted.ensureDeferred
async def test_a_chained_response_reuses_the_previous_prompt_and_reply(fake):
    fake.config.keep_responses = True
    _, first = await post(
        fake, "/v1/responses", {"instructions": "Plan.", "input": "Build a CLI.", "model": "m"}
    )
    assert first["object"] == "response" and first["id"].startswith("resp_")
    text = first["output"][0]["content"][0]["text"]
    assert first["output"][0]["type"] == "message" and text
    turn1 = first["usage"]["input_tokens"] + first["usage"]["output_tokens"]
    _, second = await post(
        fake,
        "/v1/responses",
        {"previous_response_id": first["id"], "input": "Now add tests.", "stream": True},
    )
    kinds = [line[len("event: ") :] for line in second.splitlines() if line.startswith("event: ")]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    done = fake.counters.completions[-1]
    assert done.cache_n == turn1 and done.prompt_n == done.prompt_tokens - turn1
    response, body = await post(
        fake, "/v1/responses", {"previous_response_id": "resp_x", "input": "?"}
    )
    assert response.code == 400 and "resp_x" in body["error"]["message"]


CONTINUED = [*MESSAGES, {"role": "assistant", "content": "The smallest prime is"}]


@pytest_twisted.ensureDeferred
async def test_a_trailing_assistant_message_is_continued_and_echoed_as_llama_server_does(fake):
    def both(c):
        whole = c.chat.completions.create(model="qwen-coder", messages=CONTINUED)
        chunks = list(c.chat.completions.create(model="qwen-coder", messages=CONTINUED,
                                                stream=True))  # fmt: skip
        deltas = [ch.choices[0].delta.content for ch in chunks if ch.choices]
        return whole.choices[0].message.content, [d for d in deltas if d]

    whole, deltas = await in_thread(fake, both)
    new = fake.counters.completions[-1].text  # what it generated after the prefix
    assert new and whole == "The smallest prime is" + new
    # The first content delta is the prefix and the first new token; the rest are new tokens.
    assert deltas[0].startswith("The smallest prime is") and len(deltas[0]) > len(
        CONTINUED[-1]["content"]
    )
    assert "".join(deltas) == whole


@pytest_twisted.ensureDeferred
async def test_without_prefill_the_trailing_assistant_message_is_a_finished_turn():
    fake = FakeLlama(reactor, prefill_assistant=False)
    await fake.start()
    try:
        whole = await in_thread(
            fake, lambda c: c.chat.completions.create(model="qwen-coder", messages=CONTINUED)
        )
        text = whole.choices[0].message.content
        assert text == fake.counters.completions[-1].text
        assert not text.startswith("The smallest prime is")
    finally:
        await fake.stop()


@pytest_twisted.ensureDeferred
async def test_a_cut_answer_sent_back_goes_on_as_the_uncut_one_from_its_hosts_cache(fake):
    uncut = fake.reply(MESSAGES, max_tokens=8)
    fake.faults.drop_after_chunks = 4  # the role chunk and 3 tokens
    body = {"messages": MESSAGES, "stream": True, "max_tokens": 8}
    response = await wait(client().post(fake.url + "/v1/chat/completions", json=body))
    parts = []
    with pytest.raises(ResponseFailed):
        await wait(treq.collect(response, parts.append))
    fake.faults.drop_after_chunks = None
    chunks = events(b"".join(parts).decode())
    said = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert said == fake.reply(MESSAGES, max_tokens=3)

    resumed = [*MESSAGES, {"role": "assistant", "content": said}]
    _, answer = await post(fake, "/v1/chat/completions", {"messages": resumed, "max_tokens": 5})
    # The echo and 5 new tokens read as the uncut answer, as a greedy model's would.
    assert answer["choices"][0]["message"]["content"] == uncut
    assert answer["usage"]["completion_tokens"] == 5
    # The prompt is the first one and what was said: its host still holds all of it.
    assert answer["usage"]["prompt_tokens"] == len(fake.chat_prompt(MESSAGES)) + 3
    assert answer["timings"]["prompt_n"] == 1  # llama-server evaluates one token at least


@pytest_twisted.ensureDeferred
async def test_a_continued_answer_ends_where_the_uncut_one_would_have():
    fake = FakeLlama(reactor, eos_after=6)  # the model is done after 6 tokens
    await fake.start()
    try:
        said = fake.reply(MESSAGES, max_tokens=4)
        resumed = [*MESSAGES, {"role": "assistant", "content": said}]
        _, answer = await post(fake, "/v1/chat/completions", {"messages": resumed})
        (choice,) = answer["choices"]
        assert choice["message"]["content"] == fake.reply(MESSAGES, max_tokens=6)
        assert choice["finish_reason"] == "stop" and answer["usage"]["completion_tokens"] == 2
    finally:
        await fake.stop()
