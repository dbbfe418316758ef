"""POST /api/reload: a good file takes effect at once; a bad one is refused whole, with reasons."""

import pytest_twisted

from tests.support.admin_harness import conversation, start_service, write_config
from tests.support.harness import MODEL, host_table, start_fakes
from tests.support.routes import CONVO

ROUTES = CONVO


@pytest_twisted.async_yield_fixture
async def crossbar(tmp_path):
    fakes = await start_fakes("titan", "atlas")
    running = await start_service(write_config(tmp_path / "c.toml", fakes, ROUTES), fakes)
    yield running
    await running.stop()


@pytest_twisted.ensureDeferred
async def test_a_bad_file_is_refused_with_every_error_and_the_old_config_stays(crossbar):
    bad = {
        "convo": {"hosts": ["titan", "tytan"], "affinity": "sometimes", "default_model": MODEL},
    }
    write_config(crossbar.path, crossbar.fakes, bad)
    code, body, _ = await crossbar.call("POST", "/api/reload")
    assert code == 400
    error = body["error"]
    assert (error["code"], error["type"]) == (400, "invalid_request_error")
    assert error["errors"] == [
        'routes.convo.affinity: must be "conversation" or "route"',
        'routes.convo.hosts: unknown host "tytan"',
    ]
    assert "the old config stays" in error["message"]
    assert all(line in error["message"] for line in error["errors"])
    assert crossbar.service.config.route("convo").affinity == "conversation"
    host, _ = await crossbar.chat("convo", conversation("still served"))
    assert host in ("titan", "atlas")


@pytest_twisted.ensureDeferred
async def test_a_good_file_adds_a_route_and_a_removed_host_drops_its_leases(crossbar):
    await crossbar.chat("convo", conversation("a"))
    await crossbar.chat("convo", conversation("b"))
    titan_only = {"titan": host_table(crossbar.fakes, parallel=2)["titan"]}
    routes = {**ROUTES, "convo": {"hosts": ["titan"]}, "new": {"hosts": ["titan"]}}
    write_config(crossbar.path, crossbar.fakes, routes, hosts=titan_only)

    code, body, _ = await crossbar.call("POST", "/api/reload")

    assert code == 200 and body["reloaded"] is True and body["path"] == str(crossbar.path)
    assert body["notes"] == ["hosts removed: atlas (1 leases dropped)"]
    assert [h["name"] for h in (await crossbar.get("/api/hosts"))["hosts"]] == ["titan"]
    assert [r["name"] for r in (await crossbar.get("/api/routes"))["routes"]] == ["convo", "new"]
    host, _ = await crossbar.chat("new", conversation("c"))
    assert host == "titan"
    events = (await crossbar.get("/api/events?limit=5"))["events"]
    assert ("config", "atlas") in [(e["reason"], e["from_host"]) for e in events]


@pytest_twisted.ensureDeferred
async def test_a_listener_or_store_change_is_noted_on_every_reload_until_the_file_matches_again(
    crossbar, tmp_path
):
    moved = {"db": str(tmp_path / "elsewhere.db")}
    write_config(crossbar.path, crossbar.fakes, ROUTES, server=moved)
    for _ in range(2):  # the second reload still runs on the old store: it says so again
        code, body, _ = await crossbar.call("POST", "/api/reload")
        assert code == 200
        assert body["notes"] == ["server.db changed; it takes effect at restart"]
    write_config(crossbar.path, crossbar.fakes, ROUTES)  # back to what runs
    code, body, _ = await crossbar.call("POST", "/api/reload")
    assert (code, body["notes"]) == (200, [])


@pytest_twisted.ensureDeferred
async def test_a_new_hand_off_store_size_waits_for_a_restart_its_other_keys_do_not(crossbar):
    server = {"handoff_store": "1GiB", "handoff_max_body": "1MiB", "prewarm_timeout": "5s"}
    write_config(crossbar.path, crossbar.fakes, ROUTES, server=server)
    code, body, _ = await crossbar.call("POST", "/api/reload")
    assert code == 200
    assert body["notes"] == ["server.handoff_store changed; it takes effect at restart"]
    handoff = crossbar.parts.handoff
    assert not handoff.store.enabled  # still the store it started with: off
    assert handoff.store.max_body == 1 << 20
