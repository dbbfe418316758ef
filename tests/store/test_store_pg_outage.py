"""PostgreSQL goes away under two running instances and comes back: they route on from memory,
say so, refuse operator changes with 503 (never acknowledged, then lost), and catch up by
themselves: what one kept in memory reaches the store and the other instance."""

import json

import pytest_twisted
from twisted.logger import formatEvent, globalLogPublisher

from tests.support.admin_harness import conversation
from tests.support.db_gate import DatabaseGate
from tests.support.fleet import start_fleet, within
from tests.support.harness import start_fakes
from tests.support.pg import need_postgres, pg_schema
from tests.support.routes import CONVO

ROUTES = CONVO


@pytest_twisted.ensureDeferred
async def test_the_database_going_away_degrades_both_instances_and_they_catch_up(tmp_path):
    need_postgres()
    with pg_schema() as url:
        gate = DatabaseGate(url, password="hunter2")
        logged: list[dict] = []
        globalLogPublisher.addObserver(logged.append)
        gate.open()
        fleet = await start_fleet(tmp_path, gate.url, await start_fakes("titan", "atlas"), ROUTES)
        a, b = fleet.instances
        try:
            before, _ = await a.chat("convo", conversation("before"))
            await gate.shut()

            # Routing goes on from memory: a new conversation, and its next turn, on one host.
            during, _ = await a.chat("convo", conversation("during"))
            again, _ = await a.chat("convo", conversation("during"))
            assert again == during
            assert (await b.chat("convo", conversation("before")))[0] == before
            # Both say so: a's lease write failed; b's heartbeat or follow did.
            for instance in (a, b):
                await within(lambda i=instance: i.parts.journal.degraded, 30)
                status = await instance.get("/api/status")
                assert status["status"] == "degraded" and status["store"]["degraded"]
                assert "hunter2" not in json.dumps(status)
            assert (await a.get("/api/status"))["store"]["unsaved_leases"] == 1
            code, body, _ = await a.call("PUT", "/api/routes/convo/pin", {"host": "atlas"})
            assert code == 503 and "store cannot be written" in body["error"]["message"]
            assert "hunter2" not in json.dumps(body)
            code, _, _ = await b.call("POST", "/api/hosts/titan/drain")
            assert code == 503
            assert a.parts.table.pinned("convo") is None and not b.parts.hosts.draining("titan")

            gate.open()  # the database is back; nobody restarts anything
            for instance in (a, b):
                await within(lambda i=instance: not i.parts.journal.degraded, 60)
            leases = {x.key.fp: x.host for x in await a.parts.store.list_leases()}
            assert sorted(leases.values()) == sorted([before, during])
            # b learns of the conversation a kept through the outage, and sends it home.
            await within(lambda: len(b.parts.table.snapshot("convo")) == 2, 10)
            assert (await b.chat("convo", conversation("during")))[0] == during
            code, _, _ = await a.call("PUT", "/api/routes/convo/pin", {"host": "atlas"})
            assert code == 200
            await within(lambda: b.parts.table.pinned("convo") == "atlas", 10)
        finally:
            await fleet.stop()
            await gate.shut()
            globalLogPublisher.removeObserver(logged.append)
    lines = [formatEvent(e) or "" for e in logged]
    assert any("store degraded" in line for line in lines)  # the outage was logged...
    assert not [line for line in lines if "hunter2" in line]  # ...without the password
