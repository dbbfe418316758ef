"""Crossbar in front of two fake llama-servers (real sockets, port 0) for one agent session,
with what the fakes were asked (their request shapes) and the usage rows crossbar wrote."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from attrs import define, field
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessDone
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure

from tests.agents.agents import QUIET, Agent
from tests.support.harness import Crossbar, start_crossbar, start_fakes

SLOT = 32_768  # the hosts: Gemma 3 270M with -c 32768 -np 1
SESSION_TIMEOUT = 240  # seconds; a session takes a few, OpenCode's first one about 40
_NOT_SHAPE = {"host", "content-length", "connection", "authorization", "x-api-key"}


@define
class Stage:
    """Two fakes, crossbar on route `agents`, and what the session did to them."""

    crossbar: Crossbar
    asked: list[dict[str, Any]] = field(factory=list)  # POSTs the fakes received
    rows: list[Any] = field(factory=list)

    @property
    def base(self) -> str:
        return self.crossbar.base + "/r/agents"

    async def run(self, agent: Agent, work: pathlib.Path) -> tuple[int, str]:
        """Run `agent`'s task in `work` against route `agents`."""
        return await run_agent(agent, work, self.base)

    async def stop(self) -> None:
        await self.crossbar.stop()


async def run_agent(
    agent: Agent, work: pathlib.Path, base: str, seconds: float = SESSION_TIMEOUT
) -> tuple[int, str]:
    """Run `agent`'s task in `work` against the route at `base` (HOME is `work`'s sibling
    `home`, made by the caller); its exit code and what it printed."""
    argv, extra = agent.command(work, base)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC", "OPENAI"))}
    env |= QUIET | {"HOME": str(work.parent / "home"), "PWD": str(work)} | extra
    session = _Session()
    reactor.spawnProcess(session, argv[0], argv, env=env, path=str(work))
    try:
        code = await session.ended.addTimeout(seconds, reactor)
    finally:
        if session.transport.pid is not None:  # timed out: never leave it running
            session.transport.signalProcess("KILL")
    return code, session.printed.decode("utf-8", "replace")


class _Session(ProcessProtocol):
    """One agent process: stdin closed at once (agents read a piped stdin as more prompt)."""

    def __init__(self) -> None:
        self.ended: Deferred[int] = Deferred()
        self.printed = b""

    def connectionMade(self) -> None:
        self.transport.closeStdin()

    def outReceived(self, data: bytes) -> None:
        self.printed += data

    errReceived = outReceived

    def processEnded(self, reason: Failure) -> None:
        code = 0 if reason.check(ProcessDone) else getattr(reason.value, "exitCode", None)
        self.ended.callback(code if code is not None else -1)


async def start_stage() -> Stage:
    fakes = await start_fakes("titan", "atlas", ctx=SLOT, parallel=1, eos_after=12)
    crossbar = await start_crossbar(fakes, {"agents": {"hosts": ["titan", "atlas"]}}, ctx=SLOT)
    stage = Stage(crossbar)
    crossbar.parts.usage.observers.append(stage.rows.append)
    for name, fake in fakes.items():
        _record(stage.asked, name, fake)
    return stage


def _record(asked: list[dict[str, Any]], host: str, fake: Any) -> None:
    """Keep every POST the fake receives, before it answers."""
    render = fake.api.render

    def recording(request: Any) -> object:
        if request.method == b"POST":
            raw = request.content.read()
            request.content.seek(0)
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            headers = dict(request.requestHeaders.getAllRawHeaders())
            names = {k.decode().lower(): v[0].decode() for k, v in headers.items()}
            asked.append(
                {"host": host, "uri": request.uri.decode(), "headers": names, "body": body}
            )
        return render(request)

    fake.api.render = recording


def shape(request: dict[str, Any]) -> dict[str, Any]:
    """What a request looks like, without what changes from run to run: the fixture."""
    body = request["body"] if isinstance(request["body"], dict) else {}
    headers = request["headers"]
    tools = [t.get("name") or t.get("function", {}).get("name") for t in body.get("tools") or []]
    return {
        "uri": request["uri"],
        "headers": sorted(h for h in headers if h not in _NOT_SHAPE and "forwarded" not in h),
        "body": sorted(body),
        "stream": body.get("stream"),
        "stream_options": body.get("stream_options"),
        "max_tokens": body.get("max_tokens", body.get("max_output_tokens")),
        "tools": sorted(t for t in tools if t),
    }
