"""bench/real/real_resume.py's client, run against a fake llama-server so the bench cannot rot
between its real sittings: a turn whose stream breaks is sent again whole, as an agent does, and
the bench counts what the user was sent twice; a turn that goes on whole is one attempt."""

from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.threads import deferToThread

from bench.real import real_resume
from crossbar.testing.fakellama import FakeLlama
from tests.support.harness import wait

BODY = {
    "model": "bench-model",
    "messages": real_resume.history(50),
    "max_tokens": 30,
    "stream": True,
    "stream_options": {"include_usage": True},
}


async def fake() -> FakeLlama:
    running = FakeLlama(reactor, models=["bench-model"], tokens_per_second=200)
    await running.start()
    return running


@pytest_twisted.ensureDeferred
async def test_a_broken_stream_is_sent_again_whole_and_what_the_user_had_counts_twice():
    host = await fake()
    try:

        def kill(headers: dict[str, Any]) -> None:  # the host dies at once: the stream breaks
            def cut() -> None:
                host.faults.drop_after_chunks = 0
                host.faults.cut_once = True

            reactor.callFromThread(cut)

        turn = real_resume.Turn("direct")
        url = f"{host.url}/v1/chat/completions"
        await wait(deferToThread(real_resume.run_turn, turn, url, BODY, kill, 10), 60)
        assert (turn.attempts, turn.whole, turn.finish_reason) == (2, True, "length")
        assert turn.completion_tokens == 30
        assert turn.repeated_chars >= len(host.reply(BODY["messages"], max_tokens=10))
        assert 0 < turn.first_s <= turn.finish_s and turn.stall_s > 0
    finally:
        await host.stop()


@pytest_twisted.ensureDeferred
async def test_a_stream_that_goes_on_whole_is_one_attempt_with_nothing_sent_twice():
    host = await fake()
    try:
        turn = real_resume.Turn("direct")
        url = f"{host.url}/v1/chat/completions"
        await wait(deferToThread(real_resume.run_turn, turn, url, BODY, lambda _: None, 10), 60)
        assert (turn.attempts, turn.whole, turn.repeated_chars) == (1, True, 0)
        assert turn.completion_tokens == 30
    finally:
        await host.stop()


def test_the_command_line_refuses_a_kill_after_the_answers_end():
    with pytest.raises(SystemExit) as refused:
        real_resume.parse_args(["--reply", "10", "--kill-after", "10"])
    assert refused.value.code == 2
