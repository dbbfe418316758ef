"""A real full disk: twistd crossbar whose files may not grow (RLIMIT_FSIZE) keeps serving new
conversations, says it is degraded, refuses pins, and catches up once the limit is lifted,
with no restart."""

import json
import resource
import signal
import sqlite3
import subprocess

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.task import deferLater

from crossbar.demo.launch import free_ports
from tests.support.harness import MODEL, start_fakes
from tests.support.twistd import TWISTD, config_text, until_status

pytestmark = pytest.mark.skipif(
    not hasattr(resource, "prlimit"), reason="needs Linux prlimit to lift the limit again"
)


def limited(max_bytes: int):
    """A preexec_fn: files this process writes may not grow past `max_bytes`; writing past it
    fails with EFBIG (SIGXFSZ ignored, which would otherwise kill the process)."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, resource.RLIM_INFINITY))

    return apply


def spawn_limited(config, log, max_bytes: int) -> subprocess.Popen:
    """`twistd -n crossbar` whose files may not grow past `max_bytes` (Popen returns at once)."""
    return subprocess.Popen(
        [TWISTD, "-n", "--pidfile=", f"--logfile={log}", "crossbar", "-c", str(config)],
        cwd=config.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=limited(max_bytes),
    )


async def get_json(url: str) -> dict:
    response = await treq.get(url, timeout=5, persistent=False)
    return json.loads(await response.content())


async def chat(base: str, text: str) -> int:
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": text}]}
    response = await treq.post(
        f"{base}/convo/v1/chat/completions", json=body, timeout=10, persistent=False
    )
    await response.content()
    return response.code


async def until(predicate, what: str, deadline: float = 30.0):
    for _ in range(int(deadline / 0.1)):
        value = await predicate()
        if value:
            return value
        await deferLater(reactor, 0.1, lambda: None)
    raise AssertionError(f"{what} never happened")


@pytest_twisted.ensureDeferred
async def test_a_full_disk_degrades_crossbar_visibly_and_it_recovers_by_itself(tmp_path):
    fakes = await start_fakes("titan")
    port, admin = free_ports(2)
    db = tmp_path / "c.db"
    config = tmp_path / "crossbar.toml"
    config.write_text(config_text(port, admin, db, fakes["titan"].url, ["convo"]))
    # Room for the schema (35 pages: 140 KiB since schema 8) and a few pages of WAL, not for a
    # burst of new conversations.
    process = spawn_limited(config, tmp_path / "log", 172 * 1024)
    base, api = f"http://127.0.0.1:{port}/r", f"http://127.0.0.1:{admin}"
    try:
        await until_status(f"{base}/convo/health", 200)
        served = 0
        for n in range(300):  # until the WAL can grow no more
            assert await chat(base, f"conversation {n}: " + "x" * 200) == 200
            served += 1
            if (await get_json(f"{api}/api/status"))["store"]["degraded"]:
                break
        status = await get_json(f"{api}/api/status")
        assert status["status"] == "degraded", status
        assert "full" in status["store"]["reason"] or "large" in status["store"]["reason"]
        for n in range(5):  # still served, from memory
            assert await chat(base, f"during the outage {n}") == 200
        status = await get_json(f"{api}/api/status")
        assert status["store"]["unsaved_leases"] >= 5
        pin = await treq.put(
            f"{api}/api/routes/convo/pin", json={"host": "titan"}, timeout=5, persistent=False
        )
        answer = json.loads(await pin.content())
        assert pin.code == 503 and "store cannot be written" in answer["error"]["message"]

        resource.prlimit(process.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)

        async def recovered():
            return (await get_json(f"{api}/api/status"))["status"] == "ok"

        await until(recovered, "recovery", deadline=60)
        assert process.poll() is None  # no restart
        with sqlite3.connect(db) as conn:
            (leases,) = conn.execute("SELECT COUNT(*) FROM leases WHERE model != ''").fetchone()
        assert leases == served + 5
        log = (tmp_path / "log").read_text()
        assert "store degraded" in log and "store recovered" in log
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except Exception:
            process.kill()
        await fakes["titan"].stop()
