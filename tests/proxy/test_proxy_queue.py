"""One slot, a queue behind it, and clients that leave: the slot is never lost."""

import json

import pytest_twisted
from twisted.internet.defer import Deferred

from tests.support.harness import MODEL, start_crossbar, start_fakes, until, wait

ONE = {"convo": {"hosts": ["titan"], "default_model": MODEL}}


def body(n=0, stream=False, max_tokens=3):
    return json.dumps(
        {
            "model": MODEL,
            "stream": stream,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": f"request {n}"}],
        }
    ).encode()


@pytest_twisted.ensureDeferred
async def test_a_second_request_waits_for_the_only_slot_and_says_how_long():
    fakes = await start_fakes("titan", parallel=1, tokens_per_second=50)
    crossbar = await start_crossbar(fakes, ONE, parallel=1)
    try:
        client = crossbar.client()
        first = client.post(
            crossbar.url("convo", "/v1/chat/completions"), data=body(1, max_tokens=10)
        )
        await until(lambda: crossbar.parts.limiter.in_flight("titan", MODEL) == 1)
        second = client.post(crossbar.url("convo", "/v1/chat/completions"), data=body(2))
        await until(lambda: crossbar.parts.limiter.queued("titan", MODEL) == 1)
        r1, r2 = await wait(first), await wait(second)
        await r1.content(), await r2.content()
        assert int(r1.headers.getRawHeaders("X-Crossbar-Queue-Ms")[0]) < 50
        assert int(r2.headers.getRawHeaders("X-Crossbar-Queue-Ms")[0]) >= 50
        assert fakes["titan"].counters.peak_in_flight == 1
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_full_queue_answers_429_with_retry_after():
    fakes = await start_fakes("titan", parallel=1, tokens_per_second=20)
    crossbar = await start_crossbar(fakes, ONE, server={"queue_max": 1}, parallel=1)
    try:
        client = crossbar.client()
        first = client.post(crossbar.url("convo", "/v1/chat/completions"), data=body(1))
        await until(lambda: crossbar.parts.limiter.in_flight("titan", MODEL) == 1)
        second = client.post(crossbar.url("convo", "/v1/chat/completions"), data=body(2))
        await until(lambda: crossbar.parts.limiter.queued("titan", MODEL) == 1)
        third = await wait(client.post(crossbar.url("convo", "/v1/chat/completions"), data=body(3)))
        error = json.loads(await third.content())["error"]
        assert third.code == 429 and error["type"] == "rate_limit_error"
        assert int(third.headers.getRawHeaders("Retry-After")[0]) >= 1
        for d in (first, second):
            await (await wait(d)).content()
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_client_leaving_while_queued_leaves_the_queue_at_once():
    fakes = await start_fakes("titan", parallel=1, tokens_per_second=20)
    crossbar = await start_crossbar(fakes, ONE, parallel=1)
    try:
        client = crossbar.client()
        first = client.post(crossbar.url("convo", "/v1/chat/completions"), data=body(1))
        await until(lambda: crossbar.parts.limiter.in_flight("titan", MODEL) == 1)
        leaving = client.post(crossbar.url("convo", "/v1/chat/completions"), data=body(2))
        await until(lambda: crossbar.parts.limiter.queued("titan", MODEL) == 1)
        leaving.cancel()
        await until(lambda: crossbar.parts.limiter.queued("titan", MODEL) == 0)
        await (await wait(first)).content()
        assert fakes["titan"].counters.requests["/v1/chat/completions"] == 1
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_client_leaving_mid_stream_frees_the_slot_and_aborts_the_upstream():
    fakes = await start_fakes("titan", parallel=1, tokens_per_second=20)
    crossbar = await start_crossbar(fakes, ONE, parallel=1)
    try:
        client = crossbar.client()
        response = await wait(
            client.post(crossbar.url("convo", "/v1/chat/completions"), data=body(1, True, 200))
        )
        got_one = Deferred()

        class Leave:
            def makeConnection(self, transport):
                self.transport = transport

            def dataReceived(self, data):
                if not got_one.called:
                    got_one.callback(None)
                    self.transport.stopProducing()  # the client hangs up mid-stream

            def connectionLost(self, reason):
                pass

        response.deliverBody(Leave())
        await wait(got_one)
        await until(lambda: fakes["titan"].counters.aborted == 1)
        await until(lambda: crossbar.parts.limiter.in_flight("titan", MODEL) == 0)
        nxt = await wait(client.post(crossbar.url("convo", "/v1/chat/completions"), data=body(2)))
        await nxt.content()
        assert int(nxt.headers.getRawHeaders("X-Crossbar-Queue-Ms")[0]) < 50
    finally:
        await crossbar.stop()
