"""The context guard is never stricter than llama-server: only an exact prompt count over a slot's
context is refused; a large max_tokens is passed through; an estimate only decides to count."""

import pytest
import pytest_twisted

from crossbar.proxy.guard import ContextGuard
from crossbar.wire.bodies import prompt_chars
from crossbar.wire.errors import ClientError


def check(guard: ContextGuard, model: str, host: str, limit, body: dict, count):
    """The guard's decision on `body`, read the way the proxy reads it."""
    return guard.check(model, host, limit, prompt_chars(body), count)


def body_of(chars: int, **extra) -> dict:
    return {"messages": [{"role": "user", "content": "x" * chars}], **extra}


def counter(value):
    calls = []

    async def count():
        calls.append(1)
        return value

    return count, calls


@pytest_twisted.ensureDeferred
async def test_a_prompt_far_over_the_context_is_refused_on_the_exact_count_only():
    guard = ContextGuard()
    count, calls = counter(10_000)
    with pytest.raises(ClientError) as info:
        await check(guard, "m", "titan", 1000, body_of(40_000), count)
    error = info.value
    assert (error.status, error.type, error.code) == (
        400,
        "invalid_request_error",
        "context_length_exceeded",
    )
    assert "needs 10000 tokens" in error.message and "1000-token context of a slot" in error.message
    assert "titan" in error.message
    assert calls == [1]  # an estimate, however far over, never refuses by itself


@pytest_twisted.ensureDeferred
async def test_an_estimate_far_over_is_not_a_refusal_when_the_exact_count_fits():
    """The issue's Claude Code prompt: the estimate was 2.4x the real count."""
    guard = ContextGuard()
    for _ in range(30):
        guard.learn("gemma", chars=1000, tokens=1000)  # a ratio learned on a dense prompt
    count, calls = counter(4117)
    await check(guard, "gemma", "titan", 8000, body_of(10_000), count)
    assert calls == [1] and guard.refused == 0


@pytest_twisted.ensureDeferred
async def test_a_prompt_well_under_the_context_goes_through_without_counting():
    guard = ContextGuard()
    count, calls = counter(1)
    await check(guard, "m", "titan", 1000, body_of(1000), count)
    assert calls == []


@pytest_twisted.ensureDeferred
async def test_near_the_limit_the_exact_count_decides_both_ways():
    guard = ContextGuard()
    near = body_of(4000)  # about 1000 tokens at the default ratio
    fits, calls = counter(999)  # leaves room for one token, as llama-server requires
    await check(guard, "m", "titan", 1000, near, fits)
    assert calls == [1]
    too_many, calls = counter(1000)
    with pytest.raises(ClientError, match="needs 1000 tokens"):
        await check(guard, "m", "titan", 1000, near, too_many)


@pytest_twisted.ensureDeferred
async def test_requested_output_tokens_beyond_the_context_are_passed_through():
    """Claude Code's shape: a 4k-token prompt asking for 32000 tokens on a 32k slot."""
    guard = ContextGuard()
    count, calls = counter(4117)
    body = body_of(4117 * 4, max_tokens=32_000)
    await check(guard, "m", "titan", 32_768, body, count)
    for key in ("n_predict", "max_completion_tokens", "max_output_tokens"):
        await check(guard, "m", "titan", 32_768, body_of(4117 * 4, **{key: 10**6}), count)
    assert guard.refused == 0 and calls == []


@pytest_twisted.ensureDeferred
async def test_a_host_that_cannot_count_leaves_the_decision_to_the_host():
    guard = ContextGuard()
    count, calls = counter(None)
    await check(guard, "m", "titan", 1000, body_of(400_000), count)
    assert calls == [1] and guard.refused == 0


@pytest_twisted.ensureDeferred
async def test_an_unknown_context_size_is_never_guarded():
    guard = ContextGuard()
    count, calls = counter(10**9)
    await check(guard, "m", "titan", None, body_of(10**6), count)
    assert calls == []


def test_the_ratio_is_learned_per_model_from_observed_counts():
    guard = ContextGuard()
    for _ in range(30):
        guard.learn("cjk", chars=1000, tokens=1000)
    assert guard.ratio("cjk") == pytest.approx(1.0, rel=0.01)
    assert guard.ratio("other") == guard.default_ratio


@pytest_twisted.ensureDeferred
async def test_a_learned_ratio_only_decides_when_to_count():
    guard = ContextGuard()
    for _ in range(30):
        guard.learn("cjk", chars=1000, tokens=1000)
    count, calls = counter(None)
    await check(guard, "cjk", "titan", 1000, body_of(2000), count)  # the default would skip
    assert calls == [1] and guard.refused == 0


def test_prompt_chars_reads_every_prompt_shape():
    assert prompt_chars({"prompt": "abcd"}) == 4
    assert prompt_chars({"input_prefix": "ab", "input_suffix": "cd"}) == 4
    assert prompt_chars({"instructions": "ab", "input": [{"content": [{"text": "cd"}]}]}) == 4
    assert prompt_chars({"system": "ab", "messages": [{"content": "cd"}]}) == 4 + 8
    assert prompt_chars(None) == 0
