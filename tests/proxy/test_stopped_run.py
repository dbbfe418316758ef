"""What a stopped batch run is charged (issue 48, batch that yields): its host never says what
it did, so crossbar reckons it from the host's learned pace. It read the prompt's uncached part
after its overhead, then wrote at its decode rate, never past the request's own limit."""

from __future__ import annotations

import pytest

from crossbar.limiter import Rates
from crossbar.proxy.pace import stopped_run

H, M = "titan", "qwen"


@pytest.fixture
def rates() -> Rates:
    learned = Rates()
    learned.learn(H, M, 1000, 10.0, 100, 10.0)  # 100 prompt tokens a second, 10 output
    learned.learn_overhead(H, M, 0.1)
    return learned


@pytest.mark.parametrize(
    ("prompt", "cached", "seconds", "limit", "expected"),
    [
        (50, 0, 0.3, None, (20, 0, 0)),  # stopped while reading the prompt: a fifth of it
        (50, 0, 0.6, None, (50, 0, 0)),  # read it all, wrote nothing yet
        (50, 0, 1.6, None, (50, 0, 10)),  # and a second of output at 10 a second
        (50, 0, 1.6, 4, (50, 0, 4)),  # never past its own max_tokens
        (50, 30, 0.3, None, (50, 30, 0)),  # the cached part costs no time
        (50, 0, 0.05, None, (0, 0, 0)),  # stopped within its overhead: nothing ran
    ],
)
def test_a_stopped_run_is_reckoned_from_the_hosts_pace(
    rates, prompt, cached, seconds, limit, expected
):
    assert stopped_run(rates, H, M, prompt, cached, seconds, limit) == expected
