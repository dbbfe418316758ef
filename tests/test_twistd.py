"""crossbar as an operator runs it: twistd, SIGHUP to reload, SIGTERM to stop gracefully."""

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from crossbar.demo.launch import free_ports
from tests.harness import MODEL, start_fakes, wait

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


def spawn_twistd(config: pathlib.Path, log: pathlib.Path) -> subprocess.Popen:
    """`twistd -n crossbar -c config`, logging to `log` (Popen returns at once)."""
    return subprocess.Popen(
        [TWISTD, "-n", "--pidfile=", f"--logfile={log}", "crossbar", "-c", str(config)],
        cwd=config.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def status(url: str) -> int:
    try:
        response = await treq.get(url, timeout=2, persistent=False)
        await response.content()
        return response.code
    except Exception:
        return 0


async def until_status(url: str, code: int, deadline: float = 30.0) -> None:
    for _ in range(int(deadline / 0.1)):
        if await status(url) == code:
            return
        await deferLater(reactor, 0.1, lambda: None)
    raise AssertionError(f"{url} never answered {code}")


async def exited(process: subprocess.Popen, deadline: float = 30.0) -> int:
    for _ in range(int(deadline / 0.1)):
        if process.poll() is not None:
            return process.returncode
        await deferLater(reactor, 0.1, lambda: None)
    raise AssertionError("twistd did not exit")


@pytest_twisted.ensureDeferred
async def test_twistd_serves_reloads_on_sighup_and_stops_gracefully_on_sigterm(tmp_path):
    fakes = await start_fakes("titan", tokens_per_second=20)
    port, admin = free_ports(2)
    path, log = tmp_path / "crossbar.toml", tmp_path / "crossbar.log"
    path.write_text(config_text(port, admin, tmp_path / "c.db", fakes["titan"].url, ["convo"]))
    base = f"http://127.0.0.1:{port}/r"
    process = spawn_twistd(path, log)
    try:
        await until_status(f"{base}/convo/health", 200)
        body = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
        response = await treq.post(f"{base}/convo/v1/chat/completions", json=body, persistent=False)
        assert response.code == 200 and json.loads(await response.content())["choices"]
        assert response.headers.getRawHeaders("X-Crossbar-Host") == ["titan"]

        path.write_text(
            config_text(port, admin, tmp_path / "c.db", fakes["titan"].url, ["convo", "second"])
        )
        os.kill(process.pid, signal.SIGHUP)
        await until_status(f"{base}/second/health", 200)

        path.write_text(path.read_text() + '[routes.bad]\nhosts = ["tytan"]\n')
        os.kill(process.pid, signal.SIGHUP)
        for _ in range(100):
            if 'routes.bad.hosts: unknown host "tytan"' in log.read_text():
                break
            await deferLater(reactor, 0.1, lambda: None)
        assert "reload refused" in log.read_text()
        assert await status(f"{base}/second/health") == 200  # the old config still serves

        stream = {**body, "stream": True, "max_tokens": 20}
        running = await treq.post(
            f"{base}/convo/v1/chat/completions", json=stream, persistent=False
        )
        text = running.content()
        os.kill(process.pid, signal.SIGTERM)
        assert (await wait(text, 30)).rstrip().endswith(b"data: [DONE]")
        # twistd exits by the signal that stopped it, once the stop has run its course.
        assert await exited(process) in (0, -signal.SIGTERM)
        assert "crossbar stopped" in log.read_text()
        assert "Traceback" not in log.read_text()
        assert [c.outcome for c in fakes["titan"].counters.completions] == ["done", "done"]
    finally:
        if process.poll() is None:
            process.kill()
        await fakes["titan"].stop()


@pytest_twisted.ensureDeferred
async def test_a_second_twistd_on_the_same_db_refuses_to_start_and_says_why(tmp_path):
    fakes = await start_fakes("titan")
    port, admin, port2, admin2 = free_ports(4)
    db = tmp_path / "c.db"
    first_config, second_config = tmp_path / "a.toml", tmp_path / "b.toml"
    first_config.write_text(config_text(port, admin, db, fakes["titan"].url, ["convo"]))
    second_config.write_text(config_text(port2, admin2, db, fakes["titan"].url, ["convo"]))
    first = spawn_twistd(first_config, tmp_path / "a.log")
    try:
        await until_status(f"http://127.0.0.1:{port}/r/convo/health", 200)
        second = await deferToThread(
            subprocess.run,
            [TWISTD, "-n", "--pidfile=", "crossbar", "-c", str(second_config)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode != 0
        assert f"in use by another crossbar (pid {first.pid})" in second.stderr
        assert "Traceback" not in second.stderr
        assert await status(f"http://127.0.0.1:{port}/r/convo/health") == 200  # undisturbed
    finally:
        first.send_signal(signal.SIGTERM)
        await exited(first)
        await fakes["titan"].stop()
