"""The real service: restarts move nobody, a bad reload keeps serving, a stop lets streams end."""

import json

import pytest
import pytest_twisted
from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.web.client import Agent, HTTPConnectionPool

from crossbar.config import ConfigError, load_config
from crossbar.service import make_service
from tests.harness import MODEL, start_fakes, wait


def write_config(path, fakes, hosts, route_hosts, db, **server):
    lines = [
        "[server]",
        'listen = "tcp:0:interface=127.0.0.1"',
        f'db = "{db}"',
        'health_interval = "1s"',
        *(f"{k} = {json.dumps(v)}" for k, v in server.items()),
    ]
    for name in hosts:
        lines += [f"[hosts.{name}]", f'url = "{fakes[name].url}"', f'models = ["{MODEL}"]']
    lines += ["[routes.convo]", f"hosts = {json.dumps(route_hosts)}"]
    path.write_text("\n".join(lines) + "\n")
    return load_config(path)


class Running:
    def __init__(self, service):
        self.service = service
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        self.http = HTTPClient(Agent(reactor, pool=self.pool))

    @property
    def url(self):
        return f"http://127.0.0.1:{self.service.proxy_port.getHost().port}/r/convo"

    async def chat(self, text, **extra):
        body = {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}
        response = await wait(
            self.http.post(self.url + "/v1/chat/completions", data=json.dumps(body).encode())
        )
        return response, await response.content()

    async def stop(self):
        await self.pool.closeCachedConnections()
        if self.service.running:
            await self.service.stopService()


async def start(config):
    service = make_service(config, reactor)
    service.startService()
    await wait(service.ready)
    return Running(service)


def host_of(response):
    return response.headers.getRawHeaders("X-Crossbar-Host")[0]


@pytest_twisted.ensureDeferred
async def test_a_restart_keeps_every_conversation_on_its_host_even_with_a_new_preferred_host(
    tmp_path,
):
    fakes = await start_fakes("titan", "atlas", "nova")
    db = tmp_path / "crossbar.db"
    try:
        first = await start(
            write_config(tmp_path / "a.toml", fakes, ["titan", "atlas"], ["titan", "atlas"], db)
        )
        homes = {}
        for name in ("alpha", "beta"):
            response, _ = await first.chat(f"conversation {name}")
            homes[name] = host_of(response)
        assert set(homes.values()) == {"titan", "atlas"}
        await first.stop()

        # nova is new, first in preference order and idle: the chooser would pick it.
        second = await start(
            write_config(
                tmp_path / "b.toml",
                fakes,
                ["titan", "atlas", "nova"],
                ["nova", "titan", "atlas"],
                db,
            )
        )
        try:
            for name, home in homes.items():
                response, _ = await second.chat(f"conversation {name}")
                assert host_of(response) == home
                assert response.headers.getRawHeaders("X-Crossbar-Lease") == ["reused"]
            response, _ = await second.chat("a brand new conversation")
            assert host_of(response) == "nova"
        finally:
            await second.stop()
    finally:
        for fake in fakes.values():
            await fake.stop()


@pytest_twisted.ensureDeferred
async def test_hosts_are_probed_and_discovered_before_the_port_opens(tmp_path):
    fakes = await start_fakes("titan", parallel=3, ctx=2048)
    running = await start(
        write_config(tmp_path / "c.toml", fakes, ["titan"], ["titan"], ":memory:")
    )
    try:
        hosts = running.service.app.hosts
        assert (hosts.parallel("titan", MODEL), hosts.ctx("titan", MODEL)) == (3, 2048)
        assert fakes["titan"].counters.requests["/health"] >= 1
    finally:
        await running.stop()
        await fakes["titan"].stop()


@pytest_twisted.ensureDeferred
async def test_a_reload_with_a_bad_file_is_refused_and_the_old_config_keeps_serving(tmp_path):
    fakes = await start_fakes("titan", "atlas")
    path = tmp_path / "d.toml"
    running = await start(write_config(path, fakes, ["titan"], ["titan"], ":memory:"))
    try:
        path.write_text(path.read_text() + '\n[routes.broken]\nhosts = ["tytan"]\naffinity = "x"\n')
        with pytest.raises(ConfigError) as info:
            await running.service.reload()
        assert info.value.errors == [
            'routes.broken.affinity: must be "conversation" or "route"',
            'routes.broken.hosts: unknown host "tytan"',
        ]
        response, _ = await running.chat("still serving?")
        assert response.code == 200 and host_of(response) == "titan"

        write_config(path, fakes, ["titan", "atlas"], ["atlas"], ":memory:")
        await running.service.reload()
        response, _ = await running.chat("a new conversation after a good reload")
        assert host_of(response) == "atlas"
    finally:
        await running.stop()
        for fake in fakes.values():
            await fake.stop()


@pytest_twisted.ensureDeferred
async def test_a_reload_that_removes_a_host_drops_its_leases_with_reason_config(tmp_path):
    fakes = await start_fakes("titan", "atlas")
    path = tmp_path / "e.toml"
    running = await start(
        write_config(path, fakes, ["titan", "atlas"], ["titan", "atlas"], ":memory:")
    )
    try:
        response, _ = await running.chat("lives on titan")
        assert host_of(response) == "titan"
        write_config(path, fakes, ["atlas"], ["atlas"], ":memory:")
        notes = await running.service.reload()
        assert any("titan" in note for note in notes)
        app = running.service.app
        assert app.table.snapshot() == []
        events = await app.store.list_events(route="convo")
        assert events[0].reason == "config" and events[0].from_host == "titan"
        response, _ = await running.chat("lives on titan")
        assert host_of(response) == "atlas"
    finally:
        await running.stop()
        for fake in fakes.values():
            await fake.stop()


@pytest_twisted.ensureDeferred
async def test_a_graceful_stop_lets_a_running_stream_finish_and_refuses_new_clients(tmp_path):
    fakes = await start_fakes("titan", tokens_per_second=40)
    running = await start(
        write_config(
            tmp_path / "f.toml", fakes, ["titan"], ["titan"], ":memory:", shutdown_grace="10s"
        )
    )
    try:
        body = {"model": MODEL, "stream": True, "max_tokens": 12}
        body["messages"] = [{"role": "user", "content": "a long answer please"}]
        response = await wait(
            running.http.post(running.url + "/v1/chat/completions", data=json.dumps(body).encode())
        )
        port = running.service.proxy_port.getHost().port
        assert fakes["titan"].counters.completions == []  # still streaming as the stop begins
        text = response.content()
        await wait(running.service.stopService(), 20)
        (completion,) = fakes["titan"].counters.completions
        assert completion.outcome == "done"  # the stop waited for it
        assert (await wait(text)).rstrip().endswith(b"data: [DONE]")
        with pytest.raises(Exception):  # noqa: B017 - any refusal will do
            await wait(running.http.get(f"http://127.0.0.1:{port}/r/convo/health"), 5)
    finally:
        await running.stop()
        await fakes["titan"].stop()


@pytest_twisted.ensureDeferred
async def test_a_stop_past_the_grace_period_aborts_what_is_left(tmp_path):
    fakes = await start_fakes("titan", tokens_per_second=5)
    running = await start(
        write_config(
            tmp_path / "g.toml", fakes, ["titan"], ["titan"], ":memory:", shutdown_grace="200ms"
        )
    )
    try:
        body = {"model": MODEL, "stream": True, "max_tokens": 200}
        body["messages"] = [{"role": "user", "content": "never finishes in time"}]
        response = await wait(
            running.http.post(running.url + "/v1/chat/completions", data=json.dumps(body).encode())
        )
        text = response.content()
        await wait(running.service.stopService(), 10)
        with pytest.raises(Exception):  # noqa: B017 - the body is cut
            await wait(text, 5)
        await wait(fakes["titan"].settle(), 5)
        (completion,) = fakes["titan"].counters.completions
        assert completion.outcome == "aborted"
    finally:
        await running.stop()
        await fakes["titan"].stop()
