"""crossbar run as an operator runs it: `twistd -n crossbar` as a process of its own, its
config written for it, and the waits for it to answer or to exit."""

import os
import pathlib
import subprocess
import sys
import weakref
from collections.abc import Iterable

import treq
from twisted.internet import reactor
from twisted.internet.task import deferLater

from tests.support.harness import MODEL

_LOGS: "weakref.WeakKeyDictionary[subprocess.Popen, pathlib.Path]" = weakref.WeakKeyDictionary()

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
    added to this process's environment."""
    with open(log.with_suffix(".stderr"), "wb") as stderr:  # what it says before logging
        process = subprocess.Popen(
            [TWISTD, "-n", "--pidfile=", f"--logfile={log}", "crossbar", "-c", str(config)],
            cwd=config.parent,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env={**os.environ, **(env or {})},
        )
    _LOGS[process] = log
    return process


async def status(url: str) -> int:
    try:
        response = await treq.get(url, timeout=2, persistent=False)
        await response.content()
        return response.code
    except Exception:
        return 0


async def until_status(
    url: str, code: int, deadline: float = 30.0, watch: Iterable[subprocess.Popen] = ()
) -> None:
    """Wait for `url` to answer `code`; a process of `watch` (spawn_twistd's) that exits
    meanwhile fails it at once, with the end of its log (a port another process took between
    its pick and its bind, say)."""
    for _ in range(int(deadline / 0.1)):
        if await status(url) == code:
            return
        for process in watch:
            if process.poll() is not None:
                log = _LOGS.get(process)
                tail = "(no log)"
                if log is not None:
                    said = [p for p in (log, log.with_suffix(".stderr")) if p.exists()]
                    tail = "".join(p.read_text() for p in said)[-2000:] or tail
                raise AssertionError(f"twistd exited with {process.returncode}:\n{tail}")
        await deferLater(reactor, 0.1, lambda: None)
    raise AssertionError(f"{url} never answered {code}")


async def exited(process: subprocess.Popen, deadline: float = 30.0) -> int:
    for _ in range(int(deadline / 0.1)):
        if process.poll() is not None:
            return process.returncode
        await deferLater(reactor, 0.1, lambda: None)
    raise AssertionError("twistd did not exit")
