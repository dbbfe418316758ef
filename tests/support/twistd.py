"""crossbar run as an operator runs it: `twistd -n crossbar` as a process of its own, its
config written for it, and the waits for it to answer or to exit."""

import os
import pathlib
import subprocess
import sys

import treq
from twisted.internet import reactor
from twisted.internet.task import deferLater

from tests.support.harness import MODEL

_SPAWNED: dict[subprocess.Popen, pathlib.Path] = {}

TWISTD = str(pathlib.Path(sys.executable).parent / "twistd")


def config_text(port: int, admin: int, db: pathlib.Path, url: str, routes: list[str]) -> str:
    lines = [
        "[server]",
        f'listen = "tcp:{port}:interface=127.0.0.1"',
        f'admin_listen = "tcp:{admin}:interface=127.0.0.1"',
        f'db = "{db}"',
        'shutdown_grace = "20s"',
        "[hosts.titan]",
        f'url = "{url}"',
        f'models = ["{MODEL}"]',
    ]
    for route in routes:
        lines += [f"[routes.{route}]", 'hosts = ["titan"]']
    return "\n".join(lines) + "\n"


def spawn_twistd(
    config: pathlib.Path, log: pathlib.Path, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """`twistd -n crossbar -c config`, logging to `log` (Popen returns at once); `env` is
    added to this process's environment. Every process spawned is remembered, so a wait for
    one that exited says why (its log)."""
    process = subprocess.Popen(
        [TWISTD, "-n", "--pidfile=", f"--logfile={log}", "crossbar", "-c", str(config)],
        cwd=config.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    _SPAWNED[process] = log
    return process


async def status(url: str) -> int:
    try:
        response = await treq.get(url, timeout=2, persistent=False)
        await response.content()
        return response.code
    except Exception:
        return 0


async def until_status(url: str, code: int, deadline: float = 30.0) -> None:
    """Wait for `url` to answer `code`; a twistd that exits meanwhile fails it at once, with
    the end of its log (a port taken by another process between pick and bind, say)."""
    for _ in range(int(deadline / 0.1)):
        if await status(url) == code:
            return
        for process, log in list(_SPAWNED.items()):
            if process.poll() is not None and process.returncode not in (0, -9, -15):
                _SPAWNED.pop(process)
                tail = log.read_text()[-2000:] if log.exists() else "(no log)"
                raise AssertionError(f"twistd exited with {process.returncode}:\n{tail}")
        await deferLater(reactor, 0.1, lambda: None)
    raise AssertionError(f"{url} never answered {code}")


async def exited(process: subprocess.Popen, deadline: float = 30.0) -> int:
    for _ in range(int(deadline / 0.1)):
        if process.poll() is not None:
            return process.returncode
        await deferLater(reactor, 0.1, lambda: None)
    raise AssertionError("twistd did not exit")
