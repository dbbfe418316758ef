"""Real llama.cpp llama-server processes for the tests in tests/real/, and bounded waits on them.

Every wait on a real server here is bounded, and fails at once, with the server's stderr tail,
when a llama-server dies that the test did not kill: a crashed server must fail its test in
seconds, never hang the suite (pytest-timeout's signal cannot interrupt the reactor reliably).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
from collections.abc import Awaitable
from typing import Any

import treq
from attrs import define
from twisted.internet import reactor
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.task import LoopingCall, deferLater

from crossbar.demo.launch import free_ports
from tests.support.harness import MODEL

SERVER = os.environ.get("LLAMA_SERVER", "")
GGUF = os.environ.get("LLAMA_MODEL", "")
# Under CI the real tests never skip: a missing binary fails them (`make test` builds it first).
IN_CI = os.environ.get("CI", "") == "true"
POLL = 0.1  # seconds between looks at a process or a server


def missing() -> str | None:
    """Why the real tests cannot run here, or None when the binary and the model are there."""
    if not (os.path.isfile(SERVER) and os.access(SERVER, os.X_OK)):
        return f"LLAMA_SERVER={SERVER!r} is not an executable llama-server (`make real` builds it)"
    if not os.path.isfile(GGUF):
        return f"LLAMA_MODEL={GGUF!r} is not a GGUF file (`make real` builds it)"
    return None


def server_args(ctx: int, parallel: int) -> list[str]:
    """llama-server's flags for `parallel` slots of `ctx` tokens each (-c is their total)."""
    return [
        *("-np", str(parallel), "-c", str(ctx * parallel)),
        *("-t", "1", "--alias", MODEL, "--metrics"),
        # This machine kind's CPU advertises AMX but its VM does not enable it: with repacked
        # weights llama-server (built -march=native) runs AMX tile kernels and dies of SIGILL on
        # its first request. --no-repack keeps the plain kernels. Every real launch needs it.
        "--no-repack",
    ]


@define
class Llama:
    """One real llama-server on a free port; its stdout and stderr go to `log`."""

    name: str
    port: int
    process: subprocess.Popen
    log: pathlib.Path
    killed: bool = False  # by the test, on purpose

    @classmethod
    def start(
        cls,
        name: str,
        log_dir: pathlib.Path,
        args: list[str],
        model: str | None = None,
        models_dir: pathlib.Path | None = None,
    ) -> Llama:
        """Spawn it (returns at once; `ready` waits for it to load). With `models_dir` it is
        a router: no model of its own, each GGUF file there loaded on demand in a child
        server of its own (which dies with it)."""
        (port,) = free_ports(1)
        log = log_dir / f"llama-{name}.log"
        serves = ["--models-dir", str(models_dir)] if models_dir else ["-m", model or GGUF]
        command = [SERVER, *serves, "--host", "127.0.0.1", "--port", str(port), *args]
        if shutil.which("setpriv"):
            # Die with the test run, even one that pytest-timeout ends with os._exit.
            command = ["setpriv", "--pdeathsig", "KILL", "--", *command]
        with log.open("wb") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        return cls(name, port, process, log)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, lines: int = 15) -> str:
        """The last lines the server wrote."""
        try:
            text = self.log.read_bytes()[-8192:].decode("utf-8", "replace")
        except OSError as e:
            return f"(no log: {e})"
        return "\n".join(text.splitlines()[-lines:])

    def death(self) -> str | None:
        """How it ended, with its last words, if it exited without the test killing it."""
        code = self.process.poll()
        if code is None or self.killed:
            return None
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        return f"llama-server {self.name} died ({how}); its last lines:\n{self.tail()}"

    async def ready(self, deadline: float = 60.0) -> None:
        """Wait until /health answers 200; fail at once if the process dies meanwhile."""
        for _ in range(int(deadline / POLL)):
            if (died := self.death()) is not None:
                raise AssertionError(died)
            try:
                response = await treq.get(self.url + "/health", timeout=1, persistent=False)
                await response.content()
                if response.code == 200:
                    return
            except Exception:
                pass
            await deferLater(reactor, POLL, lambda: None)
        raise AssertionError(
            f"llama-server {self.name} not healthy in {deadline} s:\n{self.tail()}"
        )

    def kill(self) -> None:
        """SIGKILL, as a crash would; the test expects it, so no wait reports it as a death."""
        self.killed = True
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    async def get(self, path: str) -> Any:
        """GET `path` straight from the server (not through crossbar): its JSON or text."""
        response = await treq.get(self.url + path, timeout=5, persistent=False)
        body = await response.content()
        assert response.code == 200, (path, response.code, body[:500])
        return body.decode() if path == "/metrics" else json.loads(body)

    async def post(self, path: str, body: dict) -> Any:
        """POST JSON `body` straight to the server: its JSON answer."""
        response = await treq.post(self.url + path, json=body, timeout=30, persistent=False)
        data = await response.content()
        assert response.code == 200, (path, response.code, data[:500])
        return json.loads(data)

    async def metric(self, name: str) -> float:
        """One of llama-server's /metrics counters (`--metrics`), e.g. `prompt_tokens_total`."""
        for line in (await self.get("/metrics")).splitlines():
            if line.startswith(f"llamacpp:{name} "):
                return float(line.split()[1])
        raise AssertionError(f"llama-server {self.name} reports no llamacpp:{name}")

    async def busy_slots(self) -> list[int]:
        """Ids of the slots /slots shows processing."""
        return [s["id"] for s in await self.get("/slots") if s.get("is_processing")]

    async def idle(self) -> None:
        """Return once /slots shows no slot processing (bound it with `Fleet.within`)."""
        while await self.busy_slots():
            await deferLater(reactor, POLL, lambda: None)


@define
class Fleet:
    """Real llama-servers by name, and bounded waits while they run."""

    llamas: dict[str, Llama]

    def deaths(self) -> list[str]:
        """Every llama-server that died without the test killing it, with its last lines."""
        return [d for llama in self.llamas.values() if (d := llama.death()) is not None]

    def within(self, awaitable: Awaitable[Any], seconds: float, what: str) -> Deferred:
        """`awaitable`'s result; an AssertionError after `seconds`, or as soon as a
        llama-server dies, naming `what` and with the servers' last lines."""
        inner = ensureDeferred(awaitable)
        outer: Deferred = Deferred(lambda _: inner.cancel())
        died: list[str] = []

        def settle(result: Any) -> None:
            if not outer.called and not died:
                outer.callback(result)

        def watch() -> None:
            if outer.called or died:
                return
            died.extend(self.deaths())
            if died:
                inner.cancel()  # stop waiting first, then fail
                outer.errback(AssertionError(f"{what}: " + "\n".join(died)))

        inner.addBoth(settle)  # a Failure passed on fails `outer`; nothing is left unhandled
        watcher = LoopingCall(watch)
        watcher.clock = reactor
        watcher.start(POLL, now=True)

        def timed_out(result: Any, timeout: float) -> Any:
            tails = "\n".join(f"{n}:\n{llama.tail(5)}" for n, llama in self.llamas.items())
            raise AssertionError(
                f"{what}: nothing in {timeout} s; the servers' last lines:\n{tails}"
            )

        def stop_watching(result: Any) -> Any:
            if watcher.running:
                watcher.stop()
            return result

        outer.addTimeout(seconds, reactor, onTimeoutCancel=timed_out)
        return outer.addBoth(stop_watching)

    async def ready(self, deadline: float = 60.0) -> None:
        """Wait for every server to load (all start loading at once)."""
        for llama in self.llamas.values():
            await llama.ready(deadline)

    def stop(self) -> list[str]:
        """Kill every server; the deaths the test did not cause, for the teardown to report."""
        deaths = self.deaths()
        for llama in self.llamas.values():
            llama.kill()
        return deaths
