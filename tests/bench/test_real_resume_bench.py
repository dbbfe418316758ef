"""bench/real/real_resume.py's client, run against a fake llama-server so the bench cannot rot
between its real sittings: a turn whose stream breaks is sent again whole, once, as an agent
does, and the bench counts what the user was sent twice; a retry that breaks too is a failure; a
turn that goes on whole is one attempt. Its summary, on made-up turns: answers compared with a
retry's, crossbar's line against the others."""

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
    """A fake llama-server fast enough for a 30-token answer in a fraction of a second."""
    running = FakeLlama(reactor, models=["bench-model"], tokens_per_second=200)
    await running.start()
    return running


@pytest_twisted.ensureDeferred
async def test_a_broken_stream_is_sent_again_whole_and_what_the_user_had_counts_twice():
    host = await fake()
    try:

        def kill(headers: dict[str, Any]) -> None:  # the host dies at once: the stream breaks
            def cut() -> None:  # this stream only: the retry is answered whole
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
        assert turn.chars_at_kill > 0 and len(turn.breaks) == 1 and not turn.error
        assert turn.answer == host.reply(BODY["messages"], max_tokens=30)
    finally:
        await host.stop()


@pytest_twisted.ensureDeferred
async def test_a_retry_that_breaks_too_is_a_failure_not_a_third_attempt():
    host = await fake()
    try:

        def kill(headers: dict[str, Any]) -> None:  # every stream from now on is cut at once
            reactor.callFromThread(setattr, host.faults, "drop_after_chunks", 0)

        turn = real_resume.Turn("direct")
        url = f"{host.url}/v1/chat/completions"
        await wait(deferToThread(real_resume.run_turn, turn, url, BODY, kill, 10), 60)
        assert (turn.attempts, turn.whole, turn.finish_s, turn.answer) == (2, False, 0.0, "")
        assert len(turn.breaks) == 2 and turn.error == turn.breaks[-1]
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


@pytest.mark.parametrize(
    "argv",
    [
        ["--reply", "10", "--kill-after", "10"],
        ["--history", "3600", "--reply", "300"],  # more than a slot holds
        ["--routers", "crossbar,nginx"],
        ["--runs", "0"],
    ],
)
def test_the_command_line_refuses_what_cannot_run(argv: list[str]):
    with pytest.raises(SystemExit) as refused:
        real_resume.parse_args(argv)
    assert refused.value.code == 2


def turn(router: str, answer: str, attempts: int, finish: float, stall: float) -> Any:
    return real_resume.Turn(
        router, finish_s=finish, stall_s=stall, attempts=attempts, whole=True, answer=answer
    )


def test_answers_are_compared_with_the_commonest_retry_and_crossbar_is_set_against_each_router():
    turns = {
        "crossbar": [
            turn("crossbar", "abcdef", 1, 10.0, 5.0),
            turn("crossbar", "abXdef", 1, 11, 5),
        ],
        "smg": [turn("smg", "abcdef", 2, 14.0, 4.0), turn("smg", "abcdef", 2, 15.0, 4.0)],
        "vllm-router": [real_resume.Turn("vllm-router", attempts=2, error="HTTP 500")],
    }
    assert real_resume.compare([t for ts in turns.values() for t in ts]) == "abcdef"
    assert [t.diverges_at for t in turns["crossbar"]] == [None, 2]
    rows = {router: real_resume.summary(ts) for router, ts in turns.items()}
    assert rows["crossbar"]["same"] == [1, 2] and rows["smg"]["same"] == [2, 2]
    assert rows["vllm-router"]["whole"] == 0 and rows["vllm-router"]["errors"] == ["HTTP 500"]
    line = real_resume.headline(rows)
    assert line.startswith("crossbar finishes in 10.5 s: 4.0 s sooner than smg")
    assert "(stall 5.0 s vs 4.0 s)" in line and "vllm-router gave no whole answer (0/1)" in line


def test_without_a_retry_that_ended_whole_nothing_is_compared():
    turns = [turn("crossbar", "abc", 1, 10.0, 5.0)]
    assert real_resume.compare(turns) == "" and turns[0].same_as_reference is None
    assert real_resume.summary(turns)["same"] == [0, 0]
    rows = {"crossbar": real_resume.summary(turns)}
    assert real_resume.headline(rows) == "crossbar finishes in 10.0 s: no other router ran"
