"""crossbar as an operator runs it: twistd, SIGHUP to reload, SIGTERM to stop gracefully."""

import json
import os
import signal

import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.task import deferLater

from crossbar.demo.launch import free_ports
from tests.support.harness import MODEL, start_fakes, wait
from tests.support.twistd import config_text, exited, spawn_twistd, status, until_status


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
async def test_two_twistd_processes_on_one_store_are_one_crossbar(tmp_path):
    # The first instance makes a conversation's lease and a pin; the second, a separate
    # process with its own config file on the same SQLite file, sees both within a second.
    fakes = await start_fakes("titan", "atlas")
    ports = free_ports(4)
    db = tmp_path / "c.db"
    hosts = [f'[hosts.{n}]\nurl = "{f.url}"\nmodels = ["{MODEL}"]\n' for n, f in fakes.items()]
    processes = []
    for i in (0, 1):
        config = tmp_path / f"{i}.toml"
        config.write_text(
            f'[server]\nlisten = "tcp:{ports[2 * i]}:interface=127.0.0.1"\n'
            f'admin_listen = "tcp:{ports[2 * i + 1]}:interface=127.0.0.1"\ndb = "{db}"\n'
            'health_interval = "500ms"\n'
            + "".join(hosts)
            + '[routes.convo]\nhosts = ["titan", "atlas"]\n[routes.other]\nhosts = ["titan", "atlas"]\n'
        )
        processes.append(spawn_twistd(config, tmp_path / f"{i}.log"))
    proxy = [f"http://127.0.0.1:{ports[0]}/r", f"http://127.0.0.1:{ports[2]}/r"]
    admin = [f"http://127.0.0.1:{ports[1]}", f"http://127.0.0.1:{ports[3]}"]
    try:
        for base in proxy:
            await until_status(f"{base}/convo/health", 200)
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        homes = []
        for base in proxy:  # the same conversation through each instance
            response = await treq.post(
                f"{base}/convo/v1/chat/completions", json=body, persistent=False
            )
            await response.content()
            assert response.code == 200
            homes.append(response.headers.getRawHeaders("X-Crossbar-Host")[0])
        assert homes[0] == homes[1]  # one conversation, one host
        pin = await treq.put(f"{admin[0]}/api/routes/other/pin", json={"host": "atlas"})
        await pin.content()
        assert pin.code == 200

        async def pinned_on_second() -> bool:
            response = await treq.get(f"{admin[1]}/api/routes", persistent=False)
            routes = json.loads(await response.content())["routes"]
            return any(r["name"] == "other" and r["pinned"] == "atlas" for r in routes)

        for _ in range(20):  # 0.1 s apart: visible within two seconds at the very most
            if await pinned_on_second():
                break
            await deferLater(reactor, 0.1, lambda: None)
        assert await pinned_on_second()

        async def alive_on_second() -> int:
            response = await treq.get(f"{admin[1]}/api/instances", persistent=False)
            instances = json.loads(await response.content())["instances"]
            return len([i for i in instances if i["alive"]])

        # Each lists the rows it read at its last heartbeat (every 500 ms here): the second may
        # have started before the first had written its own.
        for _ in range(100):
            if await alive_on_second() == 2:
                break
            await deferLater(reactor, 0.1, lambda: None)
        assert await alive_on_second() == 2
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            await exited(process)
        for fake in fakes.values():
            await fake.stop()
