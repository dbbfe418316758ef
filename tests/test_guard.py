"""The context guard refuses what cannot fit, forwards what can, and counts exactly near the line."""

import pytest
import pytest_twisted

from crossbar.bodies import prompt_chars, requested_output
from crossbar.errors import ClientError
from crossbar.guard import ContextGuard


def check(guard: ContextGuard, model: str, host: str, limit, body: dict, count):
    """The guard's decision on `body`, read the way the proxy reads it."""
    return guard.check(model, host, limit, prompt_chars(body), requested_output(body), count)


def body_of(chars: int, **extra) -> dict:
    return {"messages": [{"role": "user", "content": "x" * chars}], **extra}


def counter(value):
    calls = []

    async def count():
        calls.append(1)
        return value

    return count, calls


@pytest_twisted.ensureDeferred
async def test_a_prompt_far_over_the_context_is_refused_without_counting():
    guard = ContextGuard()
    count, calls = counter(10**9)
    with pytest.raises(ClientError) as info:
        await check(guard, "m", "titan", 1000, body_of(40_000), count)
    error = info.value
    assert (error.status, error.type, error.code) == (
        400,
        "invalid_request_error",
        "context_length_exceeded",
    )
    assert "1000-token context" in error.message and "titan" in error.message
    assert calls == []


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
    fits, calls = counter(990)
    await check(guard, "m", "titan", 1000, near, fits)
    assert calls == [1]
    too_many, calls = counter(1001)
    with pytest.raises(ClientError, match="needs 1001 tokens"):
        await check(guard, "m", "titan", 1000, near, too_many)


@pytest_twisted.ensureDeferred
async def test_requested_output_tokens_count_against_the_context():
    guard = ContextGuard()
    count, _ = counter(900)
    with pytest.raises(ClientError, match="200 of them requested"):
        await check(guard, "m", "titan", 1000, body_of(3800, max_tokens=200), count)


@pytest_twisted.ensureDeferred
async def test_a_host_that_cannot_count_leaves_the_decision_to_the_host():
    guard = ContextGuard()
    count, calls = counter(None)
    await check(guard, "m", "titan", 1000, body_of(4000), count)
    assert calls == [1]


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
async def test_a_learned_ratio_refuses_on_the_estimate_what_the_default_would_count():
    guard = ContextGuard()
    for _ in range(30):
        guard.learn("cjk", chars=1000, tokens=1000)
    count, calls = counter(None)
    with pytest.raises(ClientError, match="about"):
        await check(guard, "cjk", "titan", 1000, body_of(2000), count)
    assert calls == []


def test_prompt_chars_reads_every_prompt_shape():
    assert prompt_chars({"prompt": "abcd"}) == 4
    assert prompt_chars({"input_prefix": "ab", "input_suffix": "cd"}) == 4
    assert prompt_chars({"instructions": "ab", "input": [{"content": [{"text": "cd"}]}]}) == 4
    assert prompt_chars({"system": "ab", "messages": [{"content": "cd"}]}) == 4 + 8
    assert prompt_chars(None) == 0


def test_requested_output_reads_the_first_positive_limit():
    assert requested_output({"max_tokens": 5}) == 5
    assert requested_output({"n_predict": -1, "max_completion_tokens": 7}) == 7
    assert requested_output({"max_tokens": True}) == 0
    assert requested_output({}) == 0
