"""The real service: restarts move nobody, a bad reload keeps serving, a stop lets streams end."""

import json

import pytest
import pytest_twisted
import treq
from twisted.internet.error import ConnectionRefusedError
from twisted.web.client import ResponseFailed

from crossbar.config.values import ConfigError
from tests.support.admin_harness import start_service, write_config
from tests.support.harness import MODEL, host_table, start_fakes, wait


def routes(*hosts: str) -> dict:
    return {"convo": {"hosts": list(hosts)}}


async def chat(running, text: str, **extra):
    """(response, raw body) of one chat turn on route convo."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}
    response = await wait(
        running.http().post(
            f"{running.proxy_url}/r/convo/v1/chat/completions", data=json.dumps(body).encode()
        )
    )
    return response, await wait(response.content())


def host_of(response):
    return response.headers.getRawHeaders("X-Crossbar-Host")[0]


@pytest_twisted.ensureDeferred
async def test_a_restart_keeps_every_conversation_on_its_host_even_with_a_new_preferred_host(
    tmp_path,
):
    fakes = await start_fakes("titan", "atlas", "nova")
    db = {"db": str(tmp_path / "crossbar.db")}
    before = {name: fakes[name] for name in ("titan", "atlas")}
    try:
        path = write_config(tmp_path / "a.toml", before, routes("titan", "atlas"), server=db)
        first = await start_service(path, {})  # the fakes outlive both services
        homes = {}
        for name in ("alpha", "beta"):
            response, _ = await chat(first, f"conversation {name}")
            homes[name] = host_of(response)
        assert set(homes.values()) == {"titan", "atlas"}
        await first.stop()

        # nova is new, first in preference order and idle: the chooser would pick it.
        path = write_config(tmp_path / "b.toml", fakes, routes("nova", "titan", "atlas"), server=db)
        second = await start_service(path, {})
        try:
            for name, home in homes.items():
                response, _ = await chat(second, f"conversation {name}")
                assert host_of(response) == home
                assert response.headers.getRawHeaders("X-Crossbar-Lease") == ["reused"]
            response, _ = await chat(second, "a brand new conversation")
            assert host_of(response) == "nova"
        finally:
            await second.stop()
    finally:
        for fake in fakes.values():
            await fake.stop()


@pytest_twisted.ensureDeferred
async def test_hosts_are_probed_and_discovered_before_the_port_opens(tmp_path, serve):
    fakes = await start_fakes("titan", parallel=3, ctx=2048)
    # No parallel or ctx in the config: both must come from /props before traffic.
    path = write_config(tmp_path / "c.toml", fakes, routes("titan"), hosts=host_table(fakes))
    running = await serve(path, fakes)
    hosts = running.parts.hosts
    assert (hosts.parallel("titan", MODEL), hosts.ctx("titan", MODEL)) == (3, 2048)
    assert fakes["titan"].counters.requests["/health"] >= 1


@pytest_twisted.ensureDeferred
async def test_a_reload_with_a_bad_file_is_refused_and_the_old_config_keeps_serving(
    tmp_path, serve
):
    fakes = await start_fakes("titan", "atlas")
    path = write_config(tmp_path / "d.toml", fakes, routes("titan"))
    running = await serve(path, fakes)
    path.write_text(path.read_text() + '\n[routes.broken]\nhosts = ["tytan"]\naffinity = "x"\n')
    with pytest.raises(ConfigError) as info:
        await running.service.reload()
    assert info.value.errors == [
        'routes.broken.affinity: must be "conversation" or "route"',
        'routes.broken.hosts: unknown host "tytan"',
    ]
    response, _ = await chat(running, "still serving?")
    assert response.code == 200 and host_of(response) == "titan"

    write_config(path, fakes, routes("atlas"))
    await running.service.reload()
    response, _ = await chat(running, "a new conversation after a good reload")
    assert host_of(response) == "atlas"


@pytest_twisted.ensureDeferred
async def test_a_reload_that_removes_a_host_drops_its_leases_with_reason_config(tmp_path):
    fakes = await start_fakes("titan", "atlas")
    path = write_config(tmp_path / "e.toml", fakes, routes("titan", "atlas"))
    running = await start_service(path, fakes)
    try:
        response, _ = await chat(running, "lives on titan")
        assert host_of(response) == "titan"
        write_config(path, fakes, routes("atlas"), hosts=host_table({"atlas": fakes["atlas"]}))
        notes = await running.service.reload()
        assert any("titan" in note for note in notes)
        app = running.parts
        assert app.table.snapshot() == []
        events = await app.store.list_events(route="convo")
        assert events[0].reason == "config" and events[0].from_host == "titan"
        response, _ = await chat(running, "lives on titan")
        assert host_of(response) == "atlas"
    finally:
        await running.stop()


async def start_stream(running, max_tokens: int):
    body = {"model": MODEL, "stream": True, "max_tokens": max_tokens}
    body["messages"] = [{"role": "user", "content": "a long answer please"}]
    response = await wait(
        running.http().post(
            f"{running.proxy_url}/r/convo/v1/chat/completions", data=json.dumps(body).encode()
        )
    )
    return response.content()


@pytest_twisted.ensureDeferred
async def test_a_graceful_stop_lets_a_running_stream_finish_and_refuses_new_clients(
    tmp_path, serve
):
    fakes = await start_fakes("titan", tokens_per_second=40)
    path = write_config(
        tmp_path / "f.toml", fakes, routes("titan"), server={"shutdown_grace": "10s"}
    )
    running = await serve(path, fakes)
    text = await start_stream(running, max_tokens=12)
    health = f"{running.proxy_url}/r/convo/health"
    assert fakes["titan"].counters.completions == []  # still streaming as the stop begins
    await wait(running.service.stopService(), 20)
    (completion,) = fakes["titan"].counters.completions
    assert completion.outcome == "done"  # the stop waited for it
    assert (await wait(text)).rstrip().endswith(b"data: [DONE]")
    with pytest.raises(ConnectionRefusedError):
        await wait(treq.get(health, persistent=False), 5)


@pytest_twisted.ensureDeferred
async def test_a_stop_past_the_grace_period_aborts_what_is_left(tmp_path, serve):
    fakes = await start_fakes("titan", tokens_per_second=5)
    path = write_config(
        tmp_path / "g.toml", fakes, routes("titan"), server={"shutdown_grace": "200ms"}
    )
    running = await serve(path, fakes)
    rows = []
    running.parts.usage.observers.append(rows.append)
    text = await start_stream(running, max_tokens=200)
    text.addErrback(lambda f: f.trap(ResponseFailed) and None)  # the body is cut
    await wait(running.service.stopService(), 10)
    # The stop returned after the grace, its request already aborted and accounted: the
    # client's connection is closed (no waiting out a client timeout).
    assert await text is None
    (row,) = rows
    assert (row.status, row.error) == (200, "shutdown")
    await wait(fakes["titan"].settle(), 5)
    (completion,) = fakes["titan"].counters.completions
    assert completion.outcome == "aborted"
