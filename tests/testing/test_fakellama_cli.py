"""`crossbar-fakellama` runs as a command until SIGTERM and exits 0."""

import os
import pathlib
import re
import sys

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.protocol import ProcessProtocol
from twisted.web.client import ResponseFailed

from crossbar.testing.fakellama_cli import _config, build_parser, main
from tests.support.fakehelp import client, wait

COMMAND = str(pathlib.Path(sys.executable).parent / "crossbar-fakellama")


class Running(ProcessProtocol):
    """Collects output; `url` fires with the URL of the line the command prints."""

    def __init__(self):
        self.out = b""
        self.err = b""
        self.url = Deferred()
        self.ended = Deferred()

    def outReceived(self, data):
        self.out += data
        found = re.search(rb"http://[\w.:\[\]]+", self.out)
        if found and not self.url.called:
            self.url.callback(found.group().decode())

    def errReceived(self, data):
        self.err += data

    def processEnded(self, reason):
        self.ended.callback(reason.value.exitCode)


@pytest_twisted.ensureDeferred
async def test_the_command_serves_until_sigterm_then_exits_0():
    proc = Running()
    args = [COMMAND, "--port", "0", "--model", "a", "--model", "b", "--parallel", "3"]
    transport = reactor.spawnProcess(
        proc, COMMAND, [*args, "--tokens-per-second", "20"], env=os.environ
    )
    try:
        url = await wait(proc.url, 30)
        health = await wait(client().get(url + "/health"))
        assert health.code == 200 and await health.json() == {"status": "ok"}
        models = await (await wait(client().get(url + "/v1/models"))).json()
        assert [m["id"] for m in models["data"]] == ["a", "b"]
        props = await (await wait(client().get(url + "/props"))).json()
        assert props["total_slots"] == 3
        # A stream still running when the signal comes does not keep the process alive.
        body = {"messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 999}
        streaming = await wait(client().post(url + "/v1/chat/completions", json=body))
        assert streaming.code == 200
        cut = streaming.content()
        transport.signalProcess("TERM")
        assert await wait(proc.ended, 30) == 0, proc.err.decode()
        with pytest.raises(ResponseFailed):
            await wait(cut)
        assert proc.out.decode().count("\n") == 1  # one line: where it listens
    finally:
        if not proc.ended.called:
            transport.signalProcess("KILL")


def test_bad_flags_exit_2_with_a_message(capsys):
    assert main(["--parallel", "0"]) == 2
    assert "parallel must be positive" in capsys.readouterr().err
    assert main(["--drop-after-chunks", "-1"]) == 2
    assert main(["--reset-after-chunks", "-1"]) == 2
    assert "reset_after_chunks must be null or a count" in capsys.readouterr().err


def test_the_cut_flags_set_their_faults():
    args = build_parser().parse_args(["--drop-after-chunks", "5", "--reset-after-chunks", "2"])
    _, faults = _config(args)
    assert (faults.drop_after_chunks, faults.reset_after_chunks) == (5, 2)


@pytest_twisted.ensureDeferred
async def test_the_command_runs_a_router_of_its_models():
    proc = Running()
    args = [COMMAND, "--port", "0", "--router", "--model", "a", "--model", "b", "--loaded", "b"]
    transport = reactor.spawnProcess(proc, COMMAND, [*args, "--parallel", "3"], env=os.environ)
    try:
        url = await wait(proc.url, 30)
        listing = await (await wait(client().get(url + "/models"))).json()
        assert [(m["id"], m["status"]["value"]) for m in listing["data"]] == [
            ("a", "unloaded"),
            ("b", "loaded"),
        ]
        props = await (await wait(client().get(url + "/props?model=b"))).json()
        assert props["total_slots"] == 3
        transport.signalProcess("TERM")
        assert await wait(proc.ended, 30) == 0, proc.err.decode()
    finally:
        if not proc.ended.called:
            transport.signalProcess("KILL")


def test_router_flags_that_make_no_sense_exit_2(capsys):
    assert main(["--router", "--model", "a", "--loaded", "b"]) == 2
    assert "--loaded names no --model: b" in capsys.readouterr().err
    assert main(["--router", "--hang"]) == 2
    assert "fault switches apply to a single-model fake" in capsys.readouterr().err
