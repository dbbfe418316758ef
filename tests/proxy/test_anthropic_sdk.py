"""Anthropic's own SDK against crossbar: every error crossbar makes on /v1/messages reaches it
as the SDK's exception for that status, with Anthropic's error type and crossbar's message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import pytest
import pytest_twisted
from twisted.internet.threads import deferToThread

from tests.support.harness import MODEL, Crossbar, start_crossbar, start_fakes, until, wait

CLAUDE = "claude-sonnet-4-5-20250929"  # what Claude Code sends; the route's alias serves it
# The SDK warns about old model names; crossbar's aliases make any name right.
pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")
HELLO = [{"role": "user", "content": "Refactor the parser."}]
ROUTES = {
    "convo": {"hosts": ["titan"], "default_model": MODEL, "aliases": {"claude-*": MODEL}},
    "locked": {"hosts": ["titan"], "keys": ["k-123"], "aliases": {"claude-*": MODEL}},
}


def sdk(crossbar: Crossbar, route: str, api_key: str = "none") -> anthropic.Anthropic:
    """The official client on a route: no retries (each status is seen once), short timeout."""
    return anthropic.Anthropic(
        base_url=crossbar.url(route, ""), api_key=api_key, max_retries=0, timeout=30
    )


async def refused(call: Callable[[], Any]) -> anthropic.APIStatusError:
    """The SDK error `call` raises, run in a thread while the reactor serves crossbar."""

    def run() -> Any:
        try:
            call()
        except anthropic.APIStatusError as e:
            return e
        raise AssertionError("the call succeeded")

    return await wait(deferToThread(run), 60)


def send(client: anthropic.Anthropic, stream: bool = False, **extra: Any) -> Callable[[], Any]:
    def call() -> Any:
        with client:
            if not stream:
                return client.messages.create(
                    model=CLAUDE, max_tokens=8, messages=extra.pop("messages", HELLO), **extra
                )
            with client.messages.stream(model=CLAUDE, max_tokens=8, messages=HELLO, **extra) as s:
                return list(s.text_stream)

    return call


def check(error: anthropic.APIStatusError, cls: type, status: int, type_: str, message: str):
    assert type(error) is cls, (type(error), error)
    assert (error.status_code, error.type) == (status, type_)
    assert error.api_message == message
    assert error.body["type"] == "error" and set(error.body["error"]) == {"type", "message"}


@pytest_twisted.async_yield_fixture
async def crossbar():
    running = await start_crossbar(await start_fakes("titan"), ROUTES, server={"max_body": "1MiB"})
    yield running
    await running.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["message", "stream"])
@pytest_twisted.ensureDeferred
async def test_404_for_an_unknown_route_is_not_found_error(crossbar, stream):
    error = await refused(send(sdk(crossbar, "nope"), stream))
    check(
        error,
        anthropic.NotFoundError,
        404,
        "not_found_error",
        "unknown route 'nope': check the name in your base URL",
    )
    assert "x-crossbar-host" not in error.response.headers  # crossbar said it, no llama-server


@pytest_twisted.ensureDeferred
async def test_404_for_a_model_neither_served_nor_aliased_is_not_found_error(crossbar):
    error = await refused(send(sdk(crossbar, "convo"), extra_body={"model": "gpt-4o"}))
    check(
        error,
        anthropic.NotFoundError,
        404,
        "not_found_error",
        "model 'gpt-4o' is not served on route 'convo': use one of qwen-coder, or a name "
        "matching its aliases (claude-*)",
    )


@pytest_twisted.ensureDeferred
async def test_400_for_a_bad_request_is_invalid_request_error(crossbar):
    error = await refused(send(sdk(crossbar, "convo"), extra_body={"model": 5}))
    check(
        error,
        anthropic.BadRequestError,
        400,
        "invalid_request_error",
        '"model" must be a string',
    )


@pytest_twisted.ensureDeferred
async def test_401_for_a_wrong_key_is_authentication_error(crossbar):
    error = await refused(send(sdk(crossbar, "locked", api_key="wrong")))
    check(
        error,
        anthropic.AuthenticationError,
        401,
        "authentication_error",
        "route 'locked' needs an API key: send Authorization: Bearer <key>",
    )


@pytest_twisted.ensureDeferred
async def test_413_for_a_body_over_max_body_is_request_too_large(crossbar):
    huge = [{"role": "user", "content": "x" * (2 * 1024 * 1024)}]
    error = await refused(send(sdk(crossbar, "convo"), messages=huge))
    check(
        error,
        anthropic.ContentTooLargeError,
        413,
        "request_too_large",
        "request body is larger than this server's limit of 1MiB",
    )


async def fleet(
    routes: dict[str, Any] | None = None, server: dict[str, Any] | None = None, **knobs
):
    """titan alone behind route convo (aliases as above), the fake's `knobs` applied."""
    fakes = await start_fakes("titan", **knobs)
    return await start_crossbar(fakes, routes or {"convo": ROUTES["convo"]}, server=server)


@pytest_twisted.ensureDeferred
async def test_429_when_the_queue_is_full_is_rate_limit_error_with_retry_after():
    crossbar = await fleet(server={"queue_max": 0}, tokens_per_second=20)
    try:
        body = {"model": MODEL, "max_tokens": 40, "messages": HELLO}
        slow = crossbar.client().post(crossbar.url("convo", "/v1/messages"), json=body)
        await until(lambda: crossbar.parts.limiter.in_flight("titan", MODEL) == 1)
        error = await refused(send(sdk(crossbar, "convo")))
        check(
            error,
            anthropic.RateLimitError,
            429,
            "rate_limit_error",
            f"host titan has 0 requests waiting for {MODEL!r}; retry later",
        )
        assert int(error.response.headers["retry-after"]) >= 1
        await wait((await wait(slow)).content())
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_503_when_no_host_is_healthy_is_overloaded_error_with_retry_after():
    crossbar = await fleet(server={"unhealthy_after": 1})
    try:
        crossbar.fakes["titan"].faults.loading = True  # /health answers 503 Loading model
        await wait(crossbar.parts.hosts.probe_all())
        assert not crossbar.parts.hosts.healthy("titan")
        error = await refused(send(sdk(crossbar, "convo")))
        check(
            error,
            anthropic.ServiceUnavailableError,
            503,
            "overloaded_error",
            f"no healthy host can take model {MODEL!r} on route 'convo' now",
        )
        assert error.response.headers["retry-after"] == "5"
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_502_when_the_host_refuses_is_api_error():
    crossbar = await fleet()
    try:
        fake = crossbar.fakes["titan"]
        fake.faults.refuse = True
        await wait(fake.settle())
        error = await refused(send(sdk(crossbar, "convo")))
        check(
            error,
            anthropic.InternalServerError,
            502,
            "api_error",
            "host titan refused the connection and no other host could take the request",
        )
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_504_when_the_host_says_nothing_in_time_is_api_error():
    # The fake hangs for good: the idle timeout fires however slow the machine is.
    crossbar = await fleet(server={"upstream_idle_timeout": "1s"})
    try:
        crossbar.fakes["titan"].faults.hang = True
        error = await refused(send(sdk(crossbar, "convo")))
        check(
            error,
            anthropic.GatewayTimeoutError,
            504,
            "api_error",
            "host titan sent nothing in time; try again",
        )
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_500_when_crossbar_itself_fails_is_api_error_without_internals():
    crossbar = await fleet()
    try:

        async def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("secret internals")

        crossbar.parts.table.acquire = broken
        error = await refused(send(sdk(crossbar, "convo")))
        check(
            error,
            anthropic.InternalServerError,
            500,
            "api_error",
            "crossbar failed on this request; try again",
        )
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_prompt_over_the_context_is_invalid_request_error_counted_by_the_host(launch):
    crossbar = await launch(await start_fakes("titan"), {"convo": ROUTES["convo"]}, ctx=64)
    # Near the limit by crossbar's estimate, so the host counts it exactly: over.
    long = [{"role": "user", "content": "word " * 70}]
    error = await refused(send(sdk(crossbar, "convo"), messages=long))
    fake = crossbar.fakes["titan"]
    prompt = len(fake.chat_prompt(long))  # as the host counted it
    check(
        error,
        anthropic.BadRequestError,
        400,
        "invalid_request_error",
        f"this prompt needs {prompt} tokens, more than fit the 64-token context of a slot on "
        "host titan (a prompt must leave room for one reply token): shorten the conversation",
    )
    assert fake.counters.requests["/v1/messages/count_tokens"] == 1
    assert fake.counters.requests["/v1/messages"] == 0


@pytest_twisted.ensureDeferred
async def test_a_stream_cut_by_the_host_ends_in_an_anthropic_error_event():
    crossbar = await fleet(reply_tokens=12)
    try:
        crossbar.fakes["titan"].faults.drop_after_chunks = 4
        error = await refused(send(sdk(crossbar, "convo"), stream=True))
        assert error.type == "api_error"
        assert error.api_message == "host titan: upstream closed mid-response"
    finally:
        await crossbar.stop()
