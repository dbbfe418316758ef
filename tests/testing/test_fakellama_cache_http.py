"""Over HTTP: streams are incremental, conversations hit the prompt cache, slots are shared
fairly, and a client that leaves is counted and frees its slot."""

import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol
from twisted.web.client import ResponseDone

from tests.support.fakehelp import Fakes, client, events, post, until, user, wait


@pytest_twisted.async_yield_fixture
async def fakes():
    started = Fakes()
    yield started
    await started.stop()


class Arrivals(Protocol):
    """Records, for each delivery of body bytes, how many SSE events the fake had sent."""

    def __init__(self, fake):
        self.fake = fake
        self.seen = []  # (bytes, fake's chunks_sent at arrival)
        self.done = Deferred()

    def dataReceived(self, data):
        self.seen.append((data, self.fake.counters.chunks_sent))

    def connectionLost(self, reason):
        self.reason = reason
        self.done.callback(None)


def next_turn(history, reply_text, question):
    return [*history, {"role": "assistant", "content": reply_text}, *user(question)]


@pytest_twisted.ensureDeferred
async def test_each_sse_event_reaches_the_client_before_the_next_is_generated(fakes):
    fake = await fakes(tokens_per_second=20)
    body = {"messages": user("Stream me."), "stream": True, "max_tokens": 5}
    body["stream_options"] = {"include_usage": True}
    response = await wait(client().post(fake.url + "/v1/chat/completions", json=body))
    arrivals = Arrivals(fake)
    response.deliverBody(arrivals)
    await wait(arrivals.done)
    assert arrivals.reason.check(ResponseDone)
    data_events = [(d, sent) for d, sent in arrivals.seen if d.startswith(b"data: {")]
    # The role chunk and the first 4 tokens each arrived while the fake had sent no more than
    # it (the last token leaves together with the finish and usage chunks).
    for i, (_, sent) in enumerate(data_events[:5], start=1):
        assert sent <= i, [sent for _, sent in arrivals.seen]
    assert fake.counters.chunks_sent == 1 + 5 + 2 + 1  # role, tokens, finish, usage, [DONE]


@pytest_twisted.ensureDeferred
async def test_turn_two_reuses_turn_one_prompt_plus_reply(fakes):
    fake = await fakes(parallel=2)
    history = [{"role": "system", "content": "You write parsers."}, *user("Write one.")]
    _, first = await post(fake, "/v1/chat/completions", {"messages": history})
    reply = first["choices"][0]["message"]["content"]
    turn1 = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
    _, second = await post(
        fake, "/v1/chat/completions", {"messages": next_turn(history, reply, "Now test it.")}
    )
    assert second["timings"]["cache_n"] == turn1
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == turn1
    assert second["timings"]["prompt_n"] == second["usage"]["prompt_tokens"] - turn1
    assert fake.counters.cached_tokens == turn1


@pytest_twisted.ensureDeferred
async def test_streamed_turn_two_reuses_the_streamed_reply_too(fakes):
    fake = await fakes()
    history = user("Stream a plan.")
    asked = {"messages": history, "stream": True, "stream_options": {"include_usage": True}}
    _, text = await post(fake, "/v1/chat/completions", asked)
    chunks = events(text)
    reply = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[1:-2])
    usage = chunks[-2]["usage"]
    _, second = await post(
        fake, "/v1/chat/completions", {"messages": next_turn(history, reply, "Go on.")}
    )
    assert second["timings"]["cache_n"] == usage["prompt_tokens"] + usage["completion_tokens"]


@pytest_twisted.ensureDeferred
async def test_another_conversation_evicts_into_the_lru_and_the_first_comes_back(fakes):
    fake = await fakes(parallel=1, cache_slots=2)
    a = user("Conversation A: a compiler.")
    _, a1 = await post(fake, "/v1/chat/completions", {"messages": a})
    _, b1 = await post(fake, "/v1/chat/completions", {"messages": user("B is about gardens.")})
    assert b1["timings"]["cache_n"] < 5  # only the template's opening is shared
    assert fake.cache.idle and len(fake.cache.idle[0]) == a1["usage"]["total_tokens"]
    a2 = next_turn(a, a1["choices"][0]["message"]["content"], "And a linker?")
    _, again = await post(fake, "/v1/chat/completions", {"messages": a2})
    assert again["timings"]["cache_n"] == a1["usage"]["total_tokens"]
    assert [len(t) for t in fake.cache.idle] == [b1["usage"]["total_tokens"]]


@pytest_twisted.ensureDeferred
async def test_requests_beyond_parallel_wait_inside_the_fake(fakes):
    fake = await fakes(parallel=1, tokens_per_second=100)
    body = {"messages": user("one"), "max_tokens": 5}
    first = client().post(fake.url + "/v1/chat/completions", json=body)
    second = client().post(fake.url + "/v1/chat/completions", json=body | {"messages": user("2")})
    await until(lambda: fake.counters.queued == 1)
    assert fake.counters.in_flight == 2 and fake.cache.busy == 1
    for d in (first, second):
        response = await wait(d)
        assert response.code == 200
        await wait(response.content())
    first_done, second_done = fake.counters.completions
    assert first_done.slot == second_done.slot == 0
    assert fake.counters.peak_in_flight == 2 and fake.counters.queued == 0


@pytest_twisted.ensureDeferred
async def test_prefill_costs_time_per_uncached_token_and_tokens_come_at_the_set_rate(fakes):
    fake = await fakes(prefill_ms_per_token=2, tokens_per_second=200)
    history = user("A question with quite a few words in it, to make prefill take a while.")
    _, first = await post(fake, "/v1/chat/completions", {"messages": history, "max_tokens": 4})
    timings = first["timings"]
    assert timings["prompt_ms"] >= 0.9 * 2 * timings["prompt_n"]
    assert timings["predicted_ms"] >= 0.9 * 4 * 1000 / 200
    reply = first["choices"][0]["message"]["content"]
    _, second = await post(
        fake, "/v1/chat/completions", {"messages": next_turn(history, reply, "ok"), "max_tokens": 1}
    )
    # Only the new tokens are prefilled.
    turn1 = first["usage"]["total_tokens"]
    assert second["timings"]["prompt_n"] == second["usage"]["prompt_tokens"] - turn1
    assert second["timings"]["prompt_ms"] < timings["prompt_ms"]


@pytest_twisted.ensureDeferred
async def test_a_client_that_leaves_while_queued_leaves_the_fake_queue(fakes):
    fake = await fakes(parallel=1, tokens_per_second=50)
    body = {"messages": user("first"), "max_tokens": 10}
    first = client().post(fake.url + "/v1/chat/completions", json=body)
    await until(lambda: fake.cache.busy == 1)
    queued = client().post(fake.url + "/v1/chat/completions", json=body)
    queued.addErrback(lambda f: None)
    await until(lambda: fake.counters.queued == 1)
    queued.cancel()
    await until(lambda: fake.counters.aborted == 1)
    assert fake.counters.queued == 0 and fake.cache.queued == 0
    await wait((await wait(first)).content())
    assert [c.outcome for c in fake.counters.completions] == ["done"]


@pytest_twisted.ensureDeferred
async def test_id_slot_puts_the_request_on_that_slot(fakes):
    fake = await fakes(parallel=3)
    _, body = await post(fake, "/completion", {"prompt": "here", "id_slot": 2, "n_predict": 1})
    assert body["id_slot"] == 2 and fake.counters.completions[-1].slot == 2
    assert fake.cache.slots[2].tokens and not fake.cache.slots[0].tokens


@pytest_twisted.ensureDeferred
async def test_a_client_that_leaves_mid_stream_is_counted_aborted_and_frees_the_slot(fakes):
    fake = await fakes(parallel=1, tokens_per_second=50)
    body = {"messages": user("long"), "stream": True, "max_tokens": 500}
    response = await wait(client().post(fake.url + "/v1/chat/completions", json=body))
    got = Deferred()

    class Leave(Protocol):
        def dataReceived(self, data):
            if not got.called:
                got.callback(None)
                self.transport.stopProducing()

    response.deliverBody(Leave())
    await wait(got)
    await until(lambda: fake.counters.aborted == 1)
    assert fake.counters.in_flight == 0 and fake.cache.busy == 0
    (done,) = fake.counters.completions
    assert done.outcome == "aborted" and done.completion_tokens < 500
    # The slot keeps what was computed: the prompt and the tokens generated so far.
    assert len(fake.cache.slots[0].tokens) == done.prompt_tokens + done.completion_tokens


@pytest_twisted.ensureDeferred
async def test_control_succeeds_only_for_a_running_completion(fakes):
    fake = await fakes(tokens_per_second=50)
    body = {"messages": user("think"), "stream": True, "max_tokens": 5}
    response = await wait(client().post(fake.url + "/v1/chat/completions", json=body))
    (running,) = fake.running
    control = {"id": running, "action": "reasoning_end"}
    _, answer = await post(fake, "/v1/chat/completions/control", control)
    assert answer == {"success": True}
    await wait(response.content())
    _, answer = await post(fake, "/v1/chat/completions/control", control)
    assert answer["success"] is False
