"""The real tests' own promise: a llama-server that dies fails its test at once, with its last
lines, instead of leaving the suite waiting on a server that will never answer."""

import os
import signal

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred

from tests.real.llamas import Fleet, Llama, server_args


@pytest_twisted.ensureDeferred
async def test_a_llama_server_that_cannot_load_its_model_fails_the_start_at_once(tmp_path):
    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"this is not a GGUF file" * 64)
    llama = Llama.start("titan", tmp_path, server_args(512, 1), model=str(bogus))
    fleet = Fleet({"titan": llama})
    began = reactor.seconds()
    try:
        with pytest.raises(AssertionError) as failed:
            await fleet.within(llama.ready(deadline=60), 90, "starting titan")
    finally:
        llama.kill()
    assert reactor.seconds() - began < 15  # not the 60 s deadline
    assert "llama-server titan died (exit status" in str(failed.value)
    assert "not-a-model.gguf" in str(failed.value)  # its own last lines say what went wrong


@pytest_twisted.ensureDeferred
async def test_a_llama_server_crashing_while_a_test_waits_fails_the_wait_at_once(tmp_path):
    llama = Llama.start("titan", tmp_path, server_args(512, 1))
    fleet = Fleet({"titan": llama})
    try:
        await fleet.within(llama.ready(), 90, "starting titan")
        never: Deferred = Deferred()  # an answer that will never come
        waiting = fleet.within(never, 120, "an answer from titan")
        began = reactor.seconds()
        os.kill(llama.process.pid, signal.SIGSEGV)  # a crash, not the test's own kill
        with pytest.raises(AssertionError) as failed:
            await waiting
        assert reactor.seconds() - began < 5  # not the 120 s bound
        assert never.called  # the wait gave up what it waited for
        assert "an answer from titan: llama-server titan died (signal SIGSEGV)" in str(failed.value)
        # With its last lines: what its log holds (a crash loses what stdio had not flushed,
        # so under load the tail may end before the "listening" line).
        assert " I srv " in str(failed.value)
        assert fleet.stop() != []  # and the fixtures' teardown would report it too
    finally:
        llama.kill()
