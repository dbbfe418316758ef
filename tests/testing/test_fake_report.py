"""The fake's `report` fault makes it a lying host: whatever JSON numbers a story gives go into
every answer's `usage` and `timings`, whole or streamed, where each dialect keeps them."""

import pytest
import pytest_twisted
from twisted.internet import reactor

from crossbar.testing.fakellama import FakeLlama
from tests.support.fakehelp import events, post, user
from tests.support.harness import MODEL

LIE = {"usage": {"prompt_tokens": 2**63}, "timings": {"prompt_ms": 1e-320, "predicted_n": -5}}


@pytest_twisted.async_yield_fixture
async def fake():
    fake = FakeLlama(reactor, models=[MODEL])
    await fake.start()
    yield fake
    await fake.stop()


@pytest_twisted.ensureDeferred
async def test_a_whole_answer_reports_what_the_fault_says(fake):
    fake.faults.update({"report": LIE})
    _, body = await post(fake, "/v1/chat/completions", {"model": MODEL, "messages": user("hi")})
    assert body["usage"]["prompt_tokens"] == 2**63
    assert body["usage"]["completion_tokens"] >= 0  # the fields not given stay honest
    assert (body["timings"]["prompt_ms"], body["timings"]["predicted_n"]) == (1e-320, -5)


@pytest_twisted.ensureDeferred
async def test_a_stream_reports_it_in_its_last_events(fake):
    fake.faults.update({"report": LIE})
    ask = {"model": MODEL, "stream": True, "stream_options": {"include_usage": True},
           "messages": user("hi")}  # fmt: skip
    _, text = await post(fake, "/v1/chat/completions", ask)
    sent = [e for e in events(text) if isinstance(e, dict)]
    assert any(e.get("usage", {}).get("prompt_tokens") == 2**63 for e in sent)
    assert any(e.get("timings", {}).get("predicted_n") == -5 for e in sent)


def test_a_report_that_is_not_usage_and_timings_is_refused_before_anything_changes():
    fake = FakeLlama(reactor, models=[MODEL])
    with pytest.raises(ValueError, match="usage and timings"):
        fake.faults.update({"report": {"tokens": 5}})
    assert fake.faults.report is None
