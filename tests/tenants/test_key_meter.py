"""A key's limits are charged before its request runs: the estimate is reserved at admission
and settled to the true cost when the answer ends, so concurrent requests cannot overshoot a
limit by more than one request's estimate; a request over a limit is refused at once, with
when to try again."""

import pytest

from crossbar.config import KeyLimits, hash_secret
from crossbar.tenants import ClientKey, KeyMeter, OverLimit, period_ids
from crossbar.tenants.meter import DEFAULT_OUTPUT_ESTIMATE

T0 = 1_780_000_000.0  # a Tuesday in 2026, well inside a UTC day


def key(**limits) -> ClientKey:
    return ClientKey("ci", hash_secret("x" * 20), routes=("*",), limits=KeyLimits(**limits))


def test_a_burst_admits_no_more_than_the_tokens_per_minute_plus_one_estimate():
    meter, k = KeyMeter(), key(tpm=1000)
    admitted = []
    for _ in range(50):  # fifty requests arrive together; none has finished
        try:
            admitted.append(meter.admit(k, 130.0, T0))
        except OverLimit as e:
            assert e.limit == "tpm" and e.retry_after >= 1
    assert sum(r.estimate for r in admitted) <= 1000 + 130
    assert len(admitted) == 7  # 7 x 130 = 910 fit; the 8th would not


def test_a_request_larger_than_the_whole_limit_runs_alone_when_the_bucket_is_full():
    meter, k = KeyMeter(), key(tpm=100)
    big = meter.admit(k, 500.0, T0)  # never fits: it runs when nothing else holds the minute
    with pytest.raises(OverLimit):
        meter.admit(k, 1.0, T0)
    big.settle(400, 0, 100, T0 + 1)
    with pytest.raises(OverLimit) as e:
        meter.admit(k, 1.0, T0 + 2)
    # 500 tokens from a 100-token minute: about four minutes of refill before one more fits.
    assert 200 <= e.value.retry_after <= 300


def test_settling_gives_back_what_the_estimate_overcharged():
    meter, k = KeyMeter(), key(tpm=1000)
    first = meter.admit(k, 900.0, T0)
    with pytest.raises(OverLimit):
        meter.admit(k, 200.0, T0)
    first.settle(100, 0, 50, T0)  # it cost 150, not 900
    meter.admit(k, 800.0, T0)


def test_the_bucket_refills_over_the_minute():
    meter, k = KeyMeter(), key(tpm=600)
    meter.admit(k, 600.0, T0).settle(500, 0, 100, T0)
    with pytest.raises(OverLimit) as e:
        meter.admit(k, 100.0, T0)
    assert e.value.retry_after == pytest.approx(10.0)  # 100 tokens at 10 a second
    meter.admit(k, 100.0, T0 + 10)


def test_requests_per_minute_count_requests_whatever_their_size():
    meter, k = KeyMeter(), key(rpm=3)
    for _ in range(3):
        meter.admit(k, 1.0, T0).settle(1, 0, 0, T0)
    with pytest.raises(OverLimit) as e:
        meter.admit(k, 1.0, T0)
    assert e.value.limit == "rpm" and e.value.retry_after == pytest.approx(20.0)
    meter.admit(k, 1.0, T0 + 20)


def test_requests_in_flight_are_those_admitted_and_not_settled():
    meter, k = KeyMeter(), key(max_in_flight=2)
    a = meter.admit(k, 1.0, T0)
    meter.admit(k, 1.0, T0)
    with pytest.raises(OverLimit) as e:
        meter.admit(k, 1.0, T0)
    assert e.value.limit == "max_in_flight"
    a.settle(1, 0, 0, T0)
    a.settle(1, 0, 0, T0)  # settling twice frees one place, once
    meter.admit(k, 1.0, T0)
    with pytest.raises(OverLimit):
        meter.admit(k, 1.0, T0)


def test_a_daily_budget_counts_cached_tokens_at_their_weight_and_resets_at_midnight_utc():
    meter, k = KeyMeter(), key(tokens_per_day=1000, cached_weight=0.1)
    # A warm turn: 5000 prompt tokens, 4900 of them cached, 100 completion = 100+490+100.
    meter.admit(k, 690.0, T0).settle(5000, 4900, 100, T0)
    assert meter.status(k, T0)["tokens_today"] == pytest.approx(690)
    meter.admit(k, 300.0, T0).settle(310, 0, 0, T0)  # 1000: the budget is spent
    with pytest.raises(OverLimit) as e:
        meter.admit(k, 50.0, T0)
    midnight = (T0 // 86400 + 1) * 86400
    assert e.value.limit == "tokens_per_day"
    assert e.value.retry_after == pytest.approx(midnight - T0)
    meter.admit(k, 50.0, midnight)  # a new day
    assert period_ids(midnight)[0] != period_ids(T0)[0]


def test_the_last_request_of_a_budget_runs_alone_and_overshoots_by_its_estimate_at_most():
    meter, k = KeyMeter(), key(tokens_per_day=100)
    meter.admit(k, 90.0, T0).settle(90, 0, 0, T0)
    last = meter.admit(k, 50.0, T0)  # 10 left: it runs, nothing else of the key does
    with pytest.raises(OverLimit):
        meter.admit(k, 5.0, T0)
    last.settle(50, 0, 0, T0)
    assert meter.status(k, T0)["tokens_today"] <= 100 + 50


def test_a_monthly_budget_holds_across_days():
    meter, k = KeyMeter(), key(tokens_per_month=100)
    meter.admit(k, 60.0, T0).settle(60, 0, 0, T0)
    # 60 does not fit in the 40 left, but runs alone: the last request may overshoot.
    meter.admit(k, 60.0, T0 + 86400).settle(40, 0, 0, T0 + 86400)
    with pytest.raises(OverLimit) as e:
        meter.admit(k, 20.0, T0 + 86400)
    assert e.value.limit == "tokens_per_month"


def test_an_early_ended_stream_settles_what_was_delivered():
    meter, k = KeyMeter(), key(tokens_per_day=10_000)
    r = meter.admit(k, 1100.0, T0)  # asked for 1000 tokens of output
    r.settle(100, 0, 37, T0 + 1)  # the stream was cut after 37 tokens
    assert meter.status(k, T0 + 1)["tokens_today"] == pytest.approx(137)
    assert meter.status(k, T0 + 1)["in_flight"] == 0


def test_a_refused_request_reserves_nothing_and_is_counted_by_limit():
    meter, k = KeyMeter(), key(tpm=100)
    meter.admit(k, 100.0, T0)
    for _ in range(3):
        with pytest.raises(OverLimit):
            meter.admit(k, 10.0, T0)
    status = meter.status(k, T0)
    assert status["limited"] == {"tpm": 3}
    assert status["tokens_this_minute"] == pytest.approx(100)
    assert meter.limited() == {"ci": {"tpm": 3}}


def test_a_key_without_limits_is_never_refused_but_still_counted():
    meter, k = KeyMeter(), key()
    for _ in range(100):
        meter.admit(k, 1e6, T0)
    assert meter.status(k, T0)["in_flight"] == 100


def test_the_estimate_takes_the_output_limit_capped_else_the_mean_completion():
    meter, k = KeyMeter(), key(tpm=10_000, cached_weight=0.5)
    assert meter.estimate(k, prompt=100, cached=40, output_limit=200) == pytest.approx(280)
    assert meter.estimate(k, prompt=0, cached=0, output_limit=32000) == 4096
    meter.admit(k, 10.0, T0).settle(10, 0, 50, T0)
    assert meter.estimate(k, prompt=10, cached=0, output_limit=None) == 60


def test_without_max_tokens_a_request_is_expected_to_write_the_larger_of_its_keys_and_routes_mean():
    meter, k = KeyMeter(), key(tpm=10_000)
    # Nothing known yet: the stated default, never 0 (LiteLLM #18730's conditions).
    assert meter.estimate(k, 10, 0, None) == 10 + DEFAULT_OUTPUT_ESTIMATE
    # The route's answers have taught a mean; the key's have not yet: the default still holds
    # where the route's is smaller, the route's where it is larger.
    assert meter.estimate(k, 10, 0, None, route_mean=300.0) == 10 + DEFAULT_OUTPUT_ESTIMATE
    assert meter.estimate(k, 10, 0, None, route_mean=2000.0) == 2010
    meter.admit(k, 10.0, T0).settle(10, 0, 50, T0)
    # Once the key has a mean: the larger of its own and the route's.
    assert meter.estimate(k, 10, 0, None, route_mean=300.0) == 310
    assert meter.estimate(k, 10, 0, None, route_mean=20.0) == 60
    # The host stops at the end of its context: no estimate expects more.
    fresh = key(tpm=10_000)
    fresh = ClientKey("new", fresh.sha256, routes=("*",), limits=fresh.limits)
    assert meter.estimate(fresh, 100, 0, None, context_left=412) == 512
    assert meter.estimate(fresh, 100, 0, 2000, context_left=412) == 512


def burst(meter: KeyMeter, k: ClientKey, n: int, prompt: int, completion: int, now: float) -> int:
    """`n` requests of `k` without max_tokens arrive together, each estimated as crossbar
    estimates it; those admitted then each spend `prompt + completion` tokens. Returns the
    tokens spent."""
    admitted = []
    for _ in range(n):
        try:
            estimate = meter.estimate(k, prompt, 0, None)
            admitted.append(meter.admit(k, estimate, now, prompt))
        except OverLimit:
            pass
    for reservation in admitted:
        reservation.settle(prompt, 0, completion, now)
    return len(admitted) * (prompt + completion)


def test_a_daily_budget_hit_by_bursts_without_max_tokens_is_overshot_by_one_request_at_most():
    meter, k = KeyMeter(), key(tokens_per_day=2000)
    spent = 0
    for wave in range(5):  # a hundred at once, again and again, each really spending 200
        spent += burst(meter, k, 100, 20, 180, T0 + wave)
    assert 2000 - 200 <= spent <= 2000 + 200, spent
    assert meter.status(k, T0 + 5)["tokens_today"] == spent
    with pytest.raises(OverLimit) as e:
        meter.admit(k, meter.estimate(k, 20, 0, None), T0 + 5)
    assert e.value.limit == "tokens_per_day"


def test_a_tpm_limit_hit_by_a_burst_without_max_tokens_is_overshot_by_one_request_at_most():
    meter, k = KeyMeter(), key(tpm=1000)
    spent = burst(meter, k, 100, 20, 180, T0)  # the first ever: nothing is known of the key
    assert spent <= 1000 + 200, spent
    # The key's answers have taught its mean: the next minute's burst fills it, no more.
    spent = burst(meter, k, 100, 20, 180, T0 + 60)
    assert 1000 - 200 <= spent <= 1000 + 200, spent


def test_a_routes_mean_from_other_keys_short_answers_does_not_let_a_key_pass_its_tpm():
    # Round 5's partial: another key's capped answers taught the route a mean of 100; ten
    # requests of this key, setting no max_tokens and each writing 200, arrived together.
    # Charged the route's 100 each, nine were admitted: 1,872 tokens on a 1,000 tpm key.
    meter, k = KeyMeter(), key(tpm=1000)

    def wave(now: float) -> int:
        admitted = []
        for _ in range(10):
            try:
                estimate = meter.estimate(k, 8, 0, None, route_mean=100.0)
                admitted.append(meter.admit(k, estimate, now, 8))
            except OverLimit:
                pass
        for reservation in admitted:
            reservation.settle(8, 0, 200, now + 1)
        return len(admitted) * 208

    assert wave(T0) <= 1000 + 208  # the key's first: the default, not the route's 100
    # Its own mean known, the next minute's wave fills the bucket and no more.
    assert 1000 - 208 <= wave(T0 + 61) <= 1000


def test_a_small_key_is_served_even_when_the_default_estimate_exceeds_its_whole_limit():
    meter, k = KeyMeter(), key(tpm=300, tokens_per_day=500)
    first = meter.admit(k, meter.estimate(k, 20, 0, None), T0)  # 1044 expected: it runs alone
    with pytest.raises(OverLimit):
        meter.admit(k, meter.estimate(k, 20, 0, None), T0)
    first.settle(20, 0, 30, T0 + 1)
    # Its truth is known now: 50 a request, and the minute refills for the next.
    assert meter.estimate(k, 20, 0, None) == 50
    meter.admit(k, meter.estimate(k, 20, 0, None), T0 + 60)


class Half:
    """One of two instances."""

    def fraction(self) -> float:
        return 0.5

    def part(self, total: int) -> int:
        return max(1, total // 2)


def test_two_instances_each_take_half_of_a_rate_and_together_hold_it():
    a, b, k = KeyMeter(Half()), KeyMeter(Half()), key(tpm=1000)
    admitted = 0.0
    for meter in (a, b):
        for _ in range(30):
            try:
                meter.admit(k, 100.0, T0)
                admitted += 100
            except OverLimit:
                pass
    assert admitted == 1000


def test_two_instances_share_what_remains_of_a_budget_at_each_sync():
    a, b, k = KeyMeter(Half()), KeyMeter(Half()), key(tokens_per_day=1000)
    day = period_ids(T0)[0]
    spent = {"a": 0.0, "b": 0.0}

    def sync():
        wa, wb = a.pending(), b.pending()
        a.synced(wa, {("ci", day): sum(s for _, p, s in wb if p == day)})
        b.synced(wb, {("ci", day): sum(s for _, p, s in wa if p == day)})

    for _ in range(20):  # each instance spends as fast as it may, syncing now and then
        for name, meter in (("a", a), ("b", b)):
            for _ in range(5):
                try:
                    meter.admit(k, 40.0, T0).settle(40, 0, 0, T0)
                    spent[name] += 40
                except OverLimit:
                    pass
        sync()
    total = spent["a"] + spent["b"]
    assert 900 <= total <= 1000 + 2 * 40  # within 10%, each overshooting by one at most
    assert a.status(k, T0)["tokens_today"] == pytest.approx(total)


def test_a_spent_limit_refuses_even_a_request_expected_to_cost_nothing():
    meter, k = KeyMeter(), key(tpm=100, tokens_per_day=100)
    meter.admit(k, 100.0, T0).settle(100, 0, 0, T0)
    with pytest.raises(OverLimit) as e:
        meter.admit(k, 0.0, T0)  # no prompt, no output limit, no mean yet
    assert e.value.limit == "tpm"
    with pytest.raises(OverLimit) as e:
        meter.admit(k, 0.0, T0 + 3600)  # the minute refilled; the day's budget did not
    assert e.value.limit == "tokens_per_day"


def test_an_rpm_below_the_number_of_instances_is_served_by_each_in_turn():
    # rpm = 1 on two instances: each has half a request a minute, which never holds one.
    # An instance whose share is under one request serves one when its bucket is full.
    a, b, k = KeyMeter(Half()), KeyMeter(Half()), key(rpm=1)
    a.admit(k, 1.0, T0).settle(1, 0, 0, T0)
    with pytest.raises(OverLimit) as e:
        a.admit(k, 1.0, T0 + 1)
    assert e.value.limit == "rpm" and e.value.retry_after == pytest.approx(119)
    b.admit(k, 1.0, T0 + 60)  # the other instance, a minute later
    served = 2
    for minute in range(2, 20):  # a client behind both asks every minute, alternating
        meter = a if minute % 2 == 0 else b
        meter.admit(k, 1.0, T0 + 60 * minute)
        served += 1
        with pytest.raises(OverLimit):  # and not one more that minute
            (b if meter is a else a).admit(k, 1.0, T0 + 60 * minute + 1)
    assert served == 20  # together one a minute


def test_an_instance_serves_at_most_one_request_a_minute_of_a_fractional_rpm_share():
    meter, k = KeyMeter(Half()), key(rpm=1)
    times = [T0 + s for s in range(0, 600, 5)]  # a client stuck to one instance, every 5 s
    served = []
    for now in times:
        try:
            meter.admit(k, 1.0, now).settle(1, 0, 0, now)
            served.append(now)
        except OverLimit:
            pass
    assert [t - T0 for t in served] == [0, 120, 240, 360, 480]  # its half: one each 2 minutes
