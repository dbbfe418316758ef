"""Edges the review found: cancels that are not failures, timeouts that are not races."""

import json

import pytest_twisted
from twisted.internet import error as ierror
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from crossbar.wire.answer import HostClosed
from crossbar.wire.dialects import classify as dialect_of
from crossbar.wire.upstream import classify
from tests.support.harness import MODEL, start_fakes, until, wait

ONE = {"convo": {"hosts": ["titan"], "default_model": MODEL}}


def chat(n_words=3, **extra):
    words = " ".join(["word"] * n_words)
    return json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": words}], **extra}
    ).encode()


@pytest_twisted.ensureDeferred
async def test_a_client_leaving_during_the_exact_count_never_sends_its_request(launch):
    fakes = await start_fakes("titan", ctx=1000)
    crossbar = await launch(fakes, ONE, ctx=1000)
    counting = Deferred()
    real_send = crossbar.parts.upstream.send

    async def send(out):
        if out.url.endswith(b"/input_tokens"):
            return await counting  # the host takes its time counting
        return await real_send(out)

    crossbar.parts.upstream.send = send
    rows = []
    crossbar.parts.usage.observers.append(rows.append)
    leaving = crossbar.client().post(crossbar.url("convo", "/v1/chat/completions"), data=chat(950))
    await until(lambda: crossbar.parts.guard.exact_counts == 1)
    leaving.addErrback(lambda _: None)  # the client's own side of hanging up
    leaving.cancel()
    await until(lambda: len(rows) == 1)
    assert rows[0].error == "client disconnected"
    assert fakes["titan"].counters.requests["/v1/chat/completions"] == 0
    assert crossbar.parts.limiter.in_flight("titan", MODEL) == 0


@pytest_twisted.ensureDeferred
async def test_a_host_silent_on_a_pooled_connection_is_not_asked_twice(launch):
    fakes = await start_fakes("titan")
    crossbar = await launch(fakes, ONE, server={"upstream_idle_timeout": "300ms"})
    first = await wait(
        crossbar.client().post(crossbar.url("convo", "/v1/chat/completions"), data=chat())
    )
    await first.content()  # leaves a pooled connection to titan
    fakes["titan"].faults.hang = True
    second = await wait(
        crossbar.client().post(crossbar.url("convo", "/v1/chat/completions"), data=chat())
    )
    await second.content()
    assert second.code == 504
    assert fakes["titan"].counters.requests["/v1/chat/completions"] == 2  # not 3


@pytest_twisted.ensureDeferred
async def test_answers_crossbar_gives_itself_are_accounted_as_200(launch):
    crossbar = await launch(await start_fakes("titan"), ONE)
    rows = []
    crossbar.parts.usage.observers.append(rows.append)
    for path in ("/v1/models", "/health"):
        response = await wait(crossbar.client().get(crossbar.url("convo", path)))
        await response.content()
    assert [(r.path, r.status) for r in rows] == [("/v1/models", 200), ("/health", 200)]


def test_a_head_cut_short_is_a_reset_and_only_a_failed_connect_says_the_host_is_down():
    lost = Failure(ierror.ConnectionLost())
    cut = classify(Failure(HostClosed(answered=True, reason=lost)), reused=False)
    assert (cut.reason, cut.connecting) == ("reset", False)
    pooled = classify(Failure(HostClosed(answered=False, reason=lost)), reused=True)
    assert (pooled.reason, pooled.connecting, pooled.reused) == ("reset", False, True)
    refused = classify(Failure(ierror.ConnectionRefusedError()), reused=False)
    assert (refused.reason, refused.connecting) == ("refused", True)


def count_path(path: str, body: dict):
    return dialect_of("POST", path)[0].count_request(body)


def test_each_dialect_is_counted_by_its_own_endpoint():
    body = {"system": "s", "messages": []}
    assert count_path("/v1/messages", body)[0] == "/v1/messages/count_tokens"
    assert count_path("/v1/chat/completions", body)[0] == "/v1/chat/completions/input_tokens"
    assert count_path("/v1/responses", {"input": "x"})[0] == "/v1/responses/input_tokens"
    assert count_path("/completion", {"prompt": "p"}) == ("/tokenize", {"content": "p"})
    assert count_path("/v1/embeddings", {"input": "p"}) is None
