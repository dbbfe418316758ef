"""A host that goes down loses its conversations to another; a pinned route says so instead."""

import json

import pytest_twisted

from tests.support.harness import MODEL, start_crossbar, start_fakes, turn, wait

TWO = {"convo": {"hosts": ["titan", "atlas"], "default_model": MODEL}}


@pytest_twisted.ensureDeferred
async def test_a_stopped_host_moves_its_conversation_on_the_next_turn_with_an_unhealthy_event(
    launch,
):
    fakes = await start_fakes("titan", "atlas")
    crossbar = await launch(fakes, TWO)
    history = [{"role": "user", "content": "Keep me on one host."}]
    response, reply = await wait(crossbar.chat("convo", history))
    home = response.headers.getRawHeaders("X-Crossbar-Host")[0]
    other = "atlas" if home == "titan" else "titan"
    fakes[home].faults.refuse = True
    await fakes[home].settle()
    response, _ = await wait(crossbar.chat("convo", turn(history, reply, "still there?")))
    assert response.code == 200
    assert response.headers.getRawHeaders("X-Crossbar-Host") == [other]
    assert response.headers.getRawHeaders("X-Crossbar-Lease") == ["new"]
    assert not crossbar.parts.hosts.healthy(home)
    events = await crossbar.parts.store.list_events(route="convo")
    moved = [e for e in events if e.reason == "unhealthy"]
    assert [(e.from_host, e.to_host) for e in moved] == [(home, other)]


@pytest_twisted.ensureDeferred
async def test_a_pinned_route_whose_host_is_down_gets_503_naming_the_host(launch):
    fakes = await start_fakes("titan", "atlas")
    crossbar = await launch(fakes, TWO)
    await crossbar.pin("convo", "titan")
    fakes["titan"].faults.refuse = True
    await fakes["titan"].settle()
    history = [{"role": "user", "content": "Pinned."}]
    response, body = await wait(crossbar.chat("convo", history))
    assert response.code == 503
    assert body["error"]["type"] == "unavailable_error"
    assert "titan" in body["error"]["message"]
    assert response.headers.getRawHeaders("Retry-After")
    assert fakes["atlas"].counters.requests["/v1/chat/completions"] == 0


@pytest_twisted.ensureDeferred
async def test_an_http_error_from_the_host_is_relayed_and_never_ejects_it(launch):
    fakes = await start_fakes("titan", "atlas")
    fakes["titan"].faults.error_500 = True
    crossbar = await launch(fakes, TWO)
    response, body = await wait(crossbar.chat("convo", [{"role": "user", "content": "x"}]))
    assert response.code == 500
    assert response.headers.getRawHeaders("X-Crossbar-Host") == ["titan"]
    assert "error" in body
    assert crossbar.parts.hosts.healthy("titan")


@pytest_twisted.ensureDeferred
async def test_with_every_host_refusing_the_client_gets_a_clear_error(launch):
    fakes = await start_fakes("titan")
    crossbar = await launch(fakes, {"convo": {"hosts": ["titan"]}})
    fakes["titan"].faults.refuse = True
    await fakes["titan"].settle()
    response, body = await wait(crossbar.chat("convo", [{"role": "user", "content": "x"}]))
    assert response.code in (502, 503)
    assert body["error"]["type"] == "unavailable_error"
    assert "titan" in body["error"]["message"]


@pytest_twisted.ensureDeferred
async def test_a_host_that_hangs_before_headers_gets_504_after_the_idle_timeout(launch):
    fakes = await start_fakes("titan")
    fakes["titan"].faults.hang = True
    crossbar = await launch(
        fakes, {"convo": {"hosts": ["titan"]}}, server={"upstream_idle_timeout": "300ms"}
    )
    response, body = await wait(crossbar.chat("convo", [{"role": "user", "content": "x"}]))
    assert response.code == 504
    assert json.dumps(body).count("Traceback") == 0
    assert crossbar.parts.hosts.healthy("titan")


@pytest_twisted.ensureDeferred
async def test_a_host_that_times_out_connecting_is_marked_down_and_the_request_moves():
    import socket

    # A listening socket whose backlog is full drops new SYNs: connecting to it times out.
    blackhole = socket.socket()
    blackhole.bind(("127.0.0.1", 0))
    blackhole.listen(0)
    filler = socket.create_connection(blackhole.getsockname())
    fakes = await start_fakes("atlas")
    hosts = {
        "titan": {"url": f"http://127.0.0.1:{blackhole.getsockname()[1]}", "models": [MODEL]},
        "atlas": {"url": fakes["atlas"].url, "models": [MODEL]},
    }
    crossbar = await start_crossbar(
        fakes, TWO, server={"upstream_connect_timeout": "300ms"}, hosts=hosts
    )
    try:
        response, _ = await wait(crossbar.chat("convo", [{"role": "user", "content": "x"}]))
        assert response.code == 200
        assert response.headers.getRawHeaders("X-Crossbar-Host") == ["atlas"]
        assert not crossbar.parts.hosts.healthy("titan")
        events = await crossbar.parts.store.list_events(route="convo")
        newest = events[0]
        assert (newest.reason, newest.from_host, newest.to_host) == ("unhealthy", "titan", "atlas")
    finally:
        await crossbar.stop()
        filler.close()
        blackhole.close()
