"""Two twistd processes on one port (`reuseport:`) and one store, under load; one is killed
with SIGKILL. The survivor keeps every conversation on its host, takes back the dead one's
slot share at its first heartbeat after three missed, and has everything the dead one
acknowledged (here, a pin)."""

import json
import os
import re
import signal

import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import DeferredList, ensureDeferred
from twisted.internet.task import deferLater

from crossbar.demo.launch import free_ports
from tests.support.admin_harness import conversation
from tests.support.harness import MODEL, start_fakes
from tests.support.twistd import exited, spawn_twistd, until_status

INTERVAL = 1.0  # health_interval: heartbeats every second, dead after three missed


def _config(port: int, admin: int, db: str, fakes) -> str:
    hosts = "".join(
        f'[hosts.{name}]\nurl = "{fake.url}"\nmodels = ["{MODEL}"]\nparallel = 2\n'
        for name, fake in fakes.items()
    )
    return (
        f'[server]\nlisten = "reuseport:{port}:interface=127.0.0.1"\n'
        f'admin_listen = "tcp:{admin}:interface=127.0.0.1"\ndb = "{db}"\n'
        f'health_interval = "{INTERVAL:g}s"\nshutdown_grace = "5s"\n'
        + hosts
        + '[routes.convo]\nhosts = ["titan", "atlas"]\n'
        + '[routes.other]\nhosts = ["titan", "atlas"]\n'
    )


async def _get(url: str):
    response = await treq.get(url, timeout=5, persistent=False)
    return json.loads(await response.content())


async def _slots(admin: str) -> dict[str, int]:
    """This instance's share of each host's slots."""
    hosts = (await _get(f"{admin}/api/hosts"))["hosts"]
    return {h["name"]: h["models"][0]["share"] for h in hosts}


async def _alive(admin: str) -> int:
    return sum(i["alive"] for i in (await _get(f"{admin}/api/instances"))["instances"])


async def _until(check, what: str, seconds: float = 60.0) -> None:
    """Poll `check()` (an async predicate) every 0.1 s; generous, since processes start."""
    for _ in range(int(seconds / 0.1)):
        if await check():
            return
        await deferLater(reactor, 0.1, lambda: None)
    raise AssertionError(f"never: {what}")


class Load:
    """Conversations taking turns through the shared port until told to stop; which host
    answered each turn, and which turns failed (and when)."""

    def __init__(self, proxy: str, n: int) -> None:
        self.proxy = proxy
        self.names = [f"k{i}" for i in range(n)]
        self.hosts: dict[str, set[str]] = {name: set() for name in self.names}
        self.failed_at: list[float] = []
        self.served = 0
        self.running = True

    async def turn(self, name: str, n: int) -> None:
        messages = [*conversation(name), {"role": "user", "content": f"turn {n}"}]
        body = {"model": MODEL, "max_tokens": 4, "messages": messages}
        try:
            response = await treq.post(
                f"{self.proxy}/r/convo/v1/chat/completions", json=body, timeout=20,
                persistent=False,
            )  # fmt: skip
            await response.content()
        except Exception:  # the instance holding this connection was killed
            self.failed_at.append(reactor.seconds())
            return
        if response.code != 200:
            self.failed_at.append(reactor.seconds())
            return
        self.served += 1
        self.hosts[name].add(response.headers.getRawHeaders("X-Crossbar-Host")[0])

    async def run(self, name: str) -> None:
        n = 0
        while self.running:
            n += 1
            await self.turn(name, n)


@pytest_twisted.ensureDeferred
async def test_a_killed_instance_loses_nothing_and_the_survivor_takes_its_slots(
    tmp_path, shared_url
):
    fakes = await start_fakes("titan", "atlas", tokens_per_second=200)
    port, *admins_ports = free_ports(3)
    admins = [f"http://127.0.0.1:{p}" for p in admins_ports]
    processes = []
    for i, admin_port in enumerate(admins_ports):
        path = tmp_path / f"{i}.toml"
        path.write_text(_config(port, admin_port, shared_url, fakes))
        processes.append(spawn_twistd(path, tmp_path / f"{i}.log"))
    victim = processes[0]
    load = Load(f"http://127.0.0.1:{port}", 12)
    try:
        for admin in admins:
            await until_status(f"{admin}/api/status", 200, watch=processes)
        for admin in admins:
            await _until(lambda admin=admin: _alive_is(admin, 2), "both instances alive")
        for admin in admins:
            await _until(lambda admin=admin: _slots_are(admin, 1), "each instance has 1 of 2")
        # Acknowledged through the instance about to die: a pin.
        pin = await treq.put(f"{admins[0]}/api/routes/other/pin", json={"host": "atlas"})
        await pin.content()
        assert pin.code == 200
        for name in load.names:  # every conversation has its lease before the kill
            await load.turn(name, 0)
        assert load.failed_at == [] and all(len(h) == 1 for h in load.hosts.values())
        before = {name: next(iter(hosts)) for name, hosts in load.hosts.items()}

        runs = [ensureDeferred(load.run(name)) for name in load.names]
        await deferLater(reactor, 1.0, lambda: None)  # under load, turns in flight on both
        served_before_kill = load.served
        os.kill(victim.pid, signal.SIGKILL)
        killed_at = reactor.seconds()
        await exited(victim)

        await _until(lambda: _slots_are(admins[1], 2), "the survivor has every slot")
        recovered_at = reactor.seconds()
        await deferLater(reactor, 1.0, lambda: None)  # and serves on alone for a while
        load.running = False
        await DeferredList(runs)

        assert load.served > served_before_kill + len(load.names)
        # Only turns in flight on the killed process failed; none once it was gone.
        assert all(at < recovered_at for at in load.failed_at), load.failed_at
        assert not [at for at in load.failed_at if at > killed_at + 1.0], load.failed_at
        for name, hosts in load.hosts.items():
            assert hosts == {before[name]}, (name, hosts)  # never moved, before or after
        routes = (await _get(f"{admins[1]}/api/routes"))["routes"]
        assert {r["name"]: r["pinned"] for r in routes}["other"] == "atlas"
        leases = (await _get(f"{admins[1]}/api/leases?route=convo"))["leases"]
        assert len(leases) == len(load.names)
        instances = (await _get(f"{admins[1]}/api/instances"))["instances"]
        assert sorted(i["alive"] for i in instances) == [False, True]
        # The survivor counted it dead at its first heartbeat after three missed.
        log = (tmp_path / "1.log").read_text()
        (ago,) = re.findall(r"last beat ([\d.]+) s ago: counted dead", log)
        assert 3 * INTERVAL <= float(ago) <= 4.5 * INTERVAL, ago
    finally:
        load.running = False
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            await exited(process)
        for fake in fakes.values():
            await fake.stop()


async def _alive_is(admin: str, n: int) -> bool:
    return await _alive(admin) == n


async def _slots_are(admin: str, n: int) -> bool:
    return set((await _slots(admin)).values()) == {n}
