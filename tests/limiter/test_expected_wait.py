"""The expected wait of a (host, model): what runs and what waits, at the host's own rates,
played forward on its slots. Each story on a fake clock."""

from __future__ import annotations

import pytest
from twisted.internet.defer import CancelledError
from twisted.internet.task import Clock

from crossbar.config.limits import RouteLimits
from crossbar.limiter import Limiter, Rates, Work
from crossbar.limiter.rates import DEFAULT_DECODE, DEFAULT_OUTPUT, DEFAULT_PREFILL

H, M = "titan", "qwen"


def limiter(parallel: int = 1, queue_max: int = 8) -> tuple[Limiter, Clock]:
    clock = Clock()
    rates = Rates()
    # 500 prompt tokens/s (2 ms a token), 20 output tokens/s: the fake hosts.
    rates.learn(H, M, prefilled=500, prefill_seconds=1.0, decoded=20, decode_seconds=1.0)
    return Limiter(clock, lambda h, m: parallel, queue_max, 60.0, rates=rates), clock


def test_a_free_slot_means_no_wait():
    lim, _ = limiter(parallel=2)
    lim.acquire(H, M, work=Work(prefill=100, output=20))
    assert lim.expected_wait(H, M) == 0.0


def test_a_newcomer_waits_for_what_runs_to_write_its_output():
    lim, clock = limiter()
    lim.acquire(H, M, work=Work(prefill=100, output=20))  # 0.2 s prefill, 1 s decode
    assert lim.expected_wait(H, M) == pytest.approx(1.2)
    clock.advance(0.5)
    assert lim.expected_wait(H, M) == pytest.approx(0.7)


def test_a_stream_counts_what_it_has_written_not_the_clock():
    lim, clock = limiter()
    written = [0]
    lim.acquire(H, M, work=Work(prefill=100, output=20, streamed=lambda: written[0]))
    clock.advance(0.2)
    written[0] = 15  # a fast host: 15 of 20 tokens in 0.2 s
    assert lim.expected_wait(H, M) == pytest.approx(5 / 20)


def test_waiters_ahead_cost_their_prefill_and_their_output():
    lim, _ = limiter()
    lim.acquire(H, M, work=Work(prefill=0, output=20))  # 1 s
    lim.acquire(H, M, work=Work(prefill=250, output=10))  # 0.5 s + 0.5 s, waits
    assert lim.queued_prefill(H, M) == 250
    assert lim.expected_wait(H, M) == pytest.approx(2.0)


def test_a_waiter_counts_only_those_ahead_of_it():
    lim, _ = limiter()
    lim.acquire(H, M, work=Work(prefill=0, output=20))
    first, second = Work(prefill=0, output=20), Work(prefill=0, output=40)
    lim.acquire(H, M, work=first)
    lim.acquire(H, M, work=second)
    assert lim.expected_wait(H, M, before=first) == pytest.approx(1.0)
    assert lim.expected_wait(H, M, before=second) == pytest.approx(2.0)


def test_several_slots_free_one_by_one_and_the_queue_takes_the_first_to_free():
    lim, _ = limiter(parallel=2)
    lim.acquire(H, M, work=Work(prefill=0, output=4))  # 0.2 s
    lim.acquire(H, M, work=Work(prefill=0, output=40))  # 2 s
    assert lim.expected_wait(H, M) == pytest.approx(0.2)
    lim.acquire(H, M, work=Work(prefill=0, output=20))  # waits; takes the first slot at 0.2
    assert lim.expected_wait(H, M) == pytest.approx(1.2)


def test_a_running_request_past_its_estimate_still_holds_its_slot_a_token_longer():
    lim, clock = limiter()
    lim.acquire(H, M, work=Work(prefill=0, output=20))
    clock.advance(30)
    assert lim.expected_wait(H, M) == pytest.approx(1 / 20)


def test_a_higher_priority_waiter_goes_ahead_of_an_earlier_one():
    lim, _ = limiter()
    lim.acquire(H, M, work=Work(output=20))
    low = Work(output=20)
    lim.acquire(H, M, RouteLimits(name="low"), work=low)
    high = Work(output=40)
    lim.acquire(H, M, RouteLimits(name="high", priority=5), work=high)
    assert lim.expected_wait(H, M, before=low) == pytest.approx(3.0)  # behind high's 2 s
    assert lim.expected_wait(H, M, before=high) == pytest.approx(1.0)


def test_the_wait_ends_when_the_slot_is_released():
    lim, _ = limiter()
    release = []
    lim.acquire(H, M, work=Work(output=20)).addCallback(release.append)
    release[0]()
    assert lim.expected_wait(H, M) == 0.0


def test_a_withdrawn_waiter_leaves_uncounted_and_keeps_its_deadline_elsewhere():
    lim, clock = limiter()
    lim.acquire(H, M, work=Work(output=20))
    work = Work(prefill=100, output=20)
    pending = lim.acquire(H, M, work=work)
    errors = []
    pending.addErrback(errors.append)
    clock.advance(50)
    assert lim.withdraw(work)
    assert errors[0].check(CancelledError)
    assert lim.queued(H, M) == 0 and lim.queued_prefill(H, M) == 0
    (state,) = lim.snapshot()
    assert state.cancelled == 0  # not a client leaving
    assert not lim.withdraw(work)  # nothing left to withdraw
    # Queued again (elsewhere, here the same pair for the story) since it first waited: its
    # 60 s queue_timeout runs out 10 s later, not 60.
    lim.acquire(H, M, work=Work(output=20))
    again = lim.acquire(H, M, work=work, since=0.0)
    timed_out = []
    again.addErrback(timed_out.append)
    clock.advance(10)
    assert timed_out and "waited 60s" in str(timed_out[0].value)


def test_a_full_queue_would_refuse_and_a_free_slot_never_does():
    lim, _ = limiter(queue_max=1)
    assert not lim.would_refuse(H, M)
    lim.acquire(H, M, work=Work(output=20))
    assert not lim.would_refuse(H, M)
    lim.acquire(H, M, work=Work(output=20))
    assert lim.would_refuse(H, M)


def test_a_share_of_nothing_is_an_endless_wait():
    clock = Clock()
    lim = Limiter(clock, lambda h, m: 0, 8, 60.0)
    assert lim.expected_wait(H, M) == float("inf")


def test_rates_before_any_answer_are_the_models_other_hosts_then_the_defaults():
    rates = Rates()
    assert (rates.prefill(H, M), rates.decode(H, M)) == (DEFAULT_PREFILL, DEFAULT_DECODE)
    assert rates.source(H, M) == "default" and rates.output("r") == DEFAULT_OUTPUT
    rates.learn("atlas", M, prefilled=400, prefill_seconds=1.0, decoded=10, decode_seconds=1.0)
    assert (rates.prefill(H, M), rates.decode(H, M)) == (400, 10)
    assert rates.source(H, M) == "model" and rates.source("atlas", M) == "learned"


def test_rates_follow_a_host_that_slows_down_and_skip_samples_too_small_to_tell():
    rates = Rates()
    rates.learn(H, M, prefilled=1000, prefill_seconds=1.0, decoded=50, decode_seconds=1.0)
    rates.learn(H, M, prefilled=3, prefill_seconds=1.0, decoded=1, decode_seconds=1.0)
    assert rates.prefill(H, M) == 1000 and rates.decode(H, M) == 50
    for _ in range(30):
        rates.learn(H, M, prefilled=100, prefill_seconds=1.0, decoded=5, decode_seconds=1.0)
    assert rates.prefill(H, M) < 110 and rates.decode(H, M) < 5.5


def test_a_routes_mean_output_follows_its_turns():
    rates = Rates()
    rates.learn_output("r", 100)
    assert rates.output("r") == 100 and rates.knows_output("r")
    rates.learn_output("r", 200)
    assert rates.output("r") == pytest.approx(120)


def test_what_the_timings_leave_out_is_learned_and_counted_for_each_waiter():
    lim, _ = limiter()
    lim.rates.learn_overhead(H, M, 0.3)
    lim.rates.learn_overhead(H, M, 0.1)  # a running mean: 0.3 + 0.2 x (0.1 - 0.3)
    assert lim.rates.overhead(H, M) == pytest.approx(0.26)
    lim.acquire(H, M, work=Work(prefill=0, output=20))  # 0.26 + 1 s
    lim.acquire(H, M, work=Work(prefill=0, output=20))  # waits: 0.26 + 1 s more
    assert lim.expected_wait(H, M) == pytest.approx(2 * 1.26)
    lim.rates.learn_overhead(H, M, -5)  # a clock step backwards teaches no negative time
    assert lim.rates.overhead(H, M) >= 0


def test_slots_held_longer_than_the_rates_expect_teach_a_factor_for_every_expected_hold():
    lim, clock = limiter()
    release = []
    for _ in range(10):  # each expected 1 s (20 tokens at 20/s), each held 2 s
        lim.acquire(H, M, work=Work(prefill=0, output=20)).addCallback(release.append)
        clock.advance(2.0)
        release.pop()()
    assert lim.rates.factor(H, M) == pytest.approx(2.0, rel=0.05)
    lim.acquire(H, M, work=Work(prefill=0, output=20))
    lim.acquire(H, M, work=Work(prefill=0, output=20))
    assert lim.expected_wait(H, M) == pytest.approx(2 * 2.0, rel=0.05)


def test_a_guessed_output_or_unlearned_rates_teach_no_factor():
    lim, clock = limiter()
    release = []
    lim.acquire(H, M, work=Work(output=256, informed=False)).addCallback(release.append)
    clock.advance(1.0)
    release.pop()()
    lim.acquire("atlas", M, work=Work(output=20)).addCallback(release.append)  # rates not its own
    clock.advance(9.0)
    release.pop()()
    assert lim.rates.factor(H, M) == lim.rates.factor("atlas", M) == 1.0
