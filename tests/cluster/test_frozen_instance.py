"""An instance frozen (SIGSTOP) while another carries on: the other counts it dead and takes
its slots; when it wakes (SIGCONT) it takes none until it has re-read who holds what, so the
host never sees more requests from crossbar than it has slots."""

import json
import signal

import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import DeferredList, ensureDeferred
from twisted.internet.task import deferLater

from crossbar.demo.launch import free_ports
from tests.support.harness import MODEL, start_fakes, wait
from tests.support.twistd import spawn_twistd, until_status

INTERVAL = 0.5  # health_interval: an instance silent for 1.5 s is counted dead
PARALLEL = 4


def config(port: int, admin: int, db: str, url: str) -> str:
    return (
        f'[server]\nlisten = "tcp:{port}:interface=127.0.0.1"\n'
        f'admin_listen = "tcp:{admin}:interface=127.0.0.1"\ndb = "{db}"\n'
        f'health_interval = "{INTERVAL:g}s"\nshutdown_grace = "1s"\n'
        f'[hosts.a]\nurl = "{url}"\nmodels = ["{MODEL}"]\nparallel = {PARALLEL}\n'
        '[routes.convo]\nhosts = ["a"]\n'
    )


async def share(admin: str) -> int:
    response = await treq.get(f"{admin}/api/hosts", timeout=5, persistent=False)
    return json.loads(await response.content())["hosts"][0]["models"][0]["share"]


async def until_share(admin: str, wanted: int) -> None:
    for _ in range(300):
        if await share(admin) == wanted:
            return
        await deferLater(reactor, 0.05, lambda: None)
    raise AssertionError(f"{admin} never had a share of {wanted}")


async def chat(proxy: str, n: int) -> int:
    """One slow completion (about 2 s on the fake); its status."""
    body = {"model": MODEL, "max_tokens": 12, "messages": [{"role": "user", "content": f"{n}"}]}
    response = await treq.post(
        f"{proxy}/r/convo/v1/chat/completions", json=body, timeout=60, persistent=False
    )
    await response.content()
    return response.code


@pytest_twisted.ensureDeferred
async def test_an_instance_waking_from_a_freeze_never_overfills_a_host(tmp_path):
    # The host itself could run more at once: what it sees is what crossbar sends it.
    fake = (await start_fakes("a", parallel=2 * PARALLEL, tokens_per_second=6))["a"]
    ports = free_ports(4)
    proxies = [f"http://127.0.0.1:{p}" for p in ports[:2]]
    admins = [f"http://127.0.0.1:{p}" for p in ports[2:]]
    db = str(tmp_path / "shared.db")
    processes = []
    for i in range(2):
        path = tmp_path / f"{i}.toml"
        path.write_text(config(ports[i], ports[2 + i], db, fake.url))
        processes.append(spawn_twistd(path, tmp_path / f"{i}.log"))
    frozen = processes[0]
    try:
        for admin in admins:
            await until_status(f"{admin}/api/status", 200, watch=processes)
        for admin in admins:
            await until_share(admin, PARALLEL // 2)
        frozen.send_signal(signal.SIGSTOP)
        await until_share(admins[1], PARALLEL)  # the other counted it dead: every slot
        busy = [ensureDeferred(chat(proxies[1], n)) for n in range(PARALLEL)]
        for _ in range(200):
            if fake.counters.in_flight == PARALLEL:
                break
            await deferLater(reactor, 0.02, lambda: None)
        assert fake.counters.in_flight == PARALLEL
        frozen.send_signal(signal.SIGCONT)
        woken = [ensureDeferred(chat(proxies[0], 100 + n)) for n in range(2)]
        results = await wait(DeferredList(busy + woken, consumeErrors=True), 60)
        assert [r for ok, r in results] == [200] * (PARALLEL + 2)
        assert fake.counters.peak_in_flight <= PARALLEL, fake.counters.peak_in_flight
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
        await fake.stop()
