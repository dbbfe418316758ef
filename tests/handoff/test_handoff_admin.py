"""An operator evacuates a host from the admin API or `crossbar ctl evacuate`, and sees it go."""

from __future__ import annotations

import pytest_twisted

from tests.cli.test_ctl import ctl
from tests.support.admin_harness import conversation, start_service, write_config
from tests.support.harness import start_fakes
from tests.support.routes import CONVO

ROUTES = CONVO


async def service_with_conversations(tmp_path, names):
    fakes = await start_fakes("titan", "atlas", cache_slots=16)
    path = write_config(tmp_path / "c.toml", fakes, ROUTES, server={"handoff_store": "8MiB"})
    crossbar = await start_service(path, fakes)
    await crossbar.call("POST", "/api/hosts/atlas/drain")
    for name in names:
        host, _ = await crossbar.chat("convo", conversation(name))
        assert host == "titan"
    await crossbar.call("DELETE", "/api/hosts/atlas/drain")
    await crossbar.parts.handoff.store.flushed()
    return crossbar


@pytest_twisted.ensureDeferred
async def test_ctl_evacuate_follows_the_moves_to_the_end(tmp_path):
    crossbar = await service_with_conversations(tmp_path, ["a", "b", "c"])
    try:
        code, out, err = await ctl(crossbar, "evacuate", "titan")
        assert code == 0, err
        assert out == (
            "host titan evacuated: 3 of 3 conversations moved (3 prewarmed); "
            "it holds no leases and can be stopped\n"
        )
        hosts = {h["name"]: h for h in (await crossbar.get("/api/hosts"))["hosts"]}
        evacuation = hosts["titan"]["evacuation"]
        assert (evacuation["moved"], evacuation["left"], evacuation["running"]) == (3, 0, False)
        assert hosts["titan"]["draining"] and hosts["atlas"]["evacuation"] is None
        assert hosts["titan"]["models"][0]["leases"] == 0
        events = (await crossbar.get("/api/events?route=convo"))["events"]
        moves = [e for e in events if e["reason"] == "evacuate"]
        assert [(e["from_host"], e["to_host"]) for e in moves] == [("titan", "atlas")] * 3
        for name in ("a", "b", "c"):  # each conversation goes on, on its new host
            host, _ = await crossbar.chat("convo", conversation(name))
            assert host == "atlas"
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_evacuate_answers_at_once_with_the_progress_and_refuses_unknown_hosts(tmp_path):
    crossbar = await service_with_conversations(tmp_path, ["a", "b"])
    try:
        code, body, _ = await crossbar.call("POST", "/api/hosts/titan/evacuate")
        assert code == 200
        assert body["host"] == "titan" and body["draining"] is True
        assert body["evacuation"]["total"] == 2
        await crossbar.parts.handoff.evacuator.evacuations["titan"].done
        code, body, _ = await crossbar.call("POST", "/api/hosts/nope/evacuate")
        assert code == 404
        assert body["error"]["message"] == "no host named 'nope' in the config"
        metrics = (await crossbar.call("GET", "/metrics"))[1]
        assert 'crossbar_lease_moves_total{reason="evacuate"} 2.0' in metrics
        # Prewarms are crossbar's own work: not among the client requests it counts.
        assert 'crossbar_requests_total{host="atlas"' not in metrics
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_hand_off_store_that_cannot_write_shows_in_the_status_and_heals(tmp_path):
    import shutil

    fakes = await start_fakes("titan", "atlas")
    work = tmp_path / "state"
    work.mkdir()
    server = {"handoff_store": "8MiB", "db": str(work / "c.db")}
    path = write_config(tmp_path / "c.toml", fakes, ROUTES, server=server)
    crossbar = await start_service(path, fakes)
    try:
        store = crossbar.parts.handoff.store
        shutil.rmtree(store.directory)  # the hand-off directory goes...
        (tmp_path / "blocker").write_text("")
        blocked = store.directory
        store._files.directory = str(tmp_path / "blocker" / "sub")  # ...and cannot be made
        await crossbar.chat("convo", conversation("a"))
        await store.flushed()
        status = await crossbar.get("/api/status")
        assert status["status"] == "degraded" and status["handoff_store"]["error"]
        assert status["store"]["degraded"] is False  # the lease store is fine: only moves go cold
        store._files.directory = blocked  # an operator mends it; nothing is restarted
        await crossbar.chat("convo", conversation("b"))
        await store.flushed()
        status = await crossbar.get("/api/status")
        assert status["status"] == "ok" and status["handoff_store"]["error"] is None
        assert status["handoff_store"]["bodies"] == 1
    finally:
        await crossbar.stop()
