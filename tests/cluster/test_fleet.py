"""Several crossbar instances on one store (a shared SQLite file, and PostgreSQL) behave as one
crossbar: one host per conversation, every change everywhere within a second, the slots of a
host shared out, and the fleet shown by any instance."""

import json

import pytest_twisted
from twisted.internet.defer import DeferredList, ensureDeferred

from crossbar.leases.table import Key
from tests.support.admin_harness import conversation
from tests.support.fleet import beat_all, percentile, start_fleet, within
from tests.support.harness import MODEL, start_fakes, wait

ROUTES = {
    "convo": {"hosts": ["titan", "atlas"], "default_model": MODEL},
    "other": {"hosts": ["titan", "atlas"], "default_model": MODEL},
}


@pytest_twisted.ensureDeferred
async def test_fifty_conversations_whose_turns_alternate_between_instances_each_keep_one_host(
    tmp_path, shared_url, fleets
):
    fleet = await fleets(tmp_path, shared_url, await start_fakes("titan", "atlas"), ROUTES)
    a, b = fleet.instances
    homes = {}
    for n in range(50):
        opening = conversation(f"c{n}")
        # The first turn reaches both instances at once: both try to make the lease.
        first = await wait(DeferredList([ensureDeferred(x.chat("convo", opening)) for x in (a, b)]))
        hosts = {result[1][0] for result in first}
        assert len(hosts) == 1, (n, hosts)
        (homes[n],) = hosts
        for turn, instance in enumerate((a, b, a)):
            history = [*opening, {"role": "user", "content": f"turn {turn}"}]
            host, _ = await instance.chat("convo", history)
            assert host == homes[n], n
    assert set(homes.values()) == {"titan", "atlas"}
    # The hosts' own logs agree: each conversation's prompts reached one host only.
    for n, home in homes.items():
        seen = {
            name
            for name, fake in fleet.fakes.items()
            for c in fake.counters.completions
            if c.opening.startswith(f"Conversation c{n}:")
        }
        assert seen == {home}, n
    served = {name: len(f.counters.completions) for name, f in fleet.fakes.items()}
    assert sum(served.values()) == 50 * 5
    for instance in (a, b):
        leases = {x.key.fp: x.host for x in instance.parts.table.snapshot()}
        assert len(leases) == 50  # and both instances know every one of them
    assert {x.key: x.host for x in a.parts.table.snapshot()} == {
        x.key: x.host for x in b.parts.table.snapshot()
    }


@pytest_twisted.ensureDeferred
async def test_every_change_on_one_instance_reaches_the_other_within_a_second(
    tmp_path, shared_url, fleets
):
    fleet = await fleets(tmp_path, shared_url, await start_fakes("titan", "atlas"), ROUTES)
    a, b = fleet.instances
    delays = []
    for n in range(6):
        await a.chat("convo", conversation(f"p{n}"))
        delays.append(await within(lambda n=n: len(b.parts.table.snapshot("convo")) == n + 1, 5))
    assert [x.host for x in b.parts.table.snapshot()] == [x.host for x in a.parts.table.snapshot()]
    code, _, _ = await a.call("PUT", "/api/routes/other/pin", {"host": "atlas"})
    assert code == 200
    delays.append(await within(lambda: b.parts.table.pinned("other") == "atlas", 5))
    await a.call("DELETE", "/api/routes/other/pin")
    delays.append(await within(lambda: b.parts.table.pinned("other") is None, 5))
    await a.call("POST", "/api/hosts/titan/drain")
    delays.append(await within(lambda: b.parts.hosts.draining("titan"), 5))
    await a.call("DELETE", "/api/hosts/titan/drain")
    delays.append(await within(lambda: not b.parts.hosts.draining("titan"), 5))
    code, released, _ = await a.call("DELETE", "/api/routes/convo/leases")
    assert released["released"] == 6
    delays.append(await within(lambda: b.parts.table.snapshot("convo") == [], 5))
    p50, p99 = percentile(delays, 0.5), percentile(delays, 0.99)
    print(
        f"propagation over {len(delays)} changes: p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms"
    )
    assert p99 <= 1.0


@pytest_twisted.ensureDeferred
async def test_a_hosts_slots_are_shared_out_so_it_never_sees_more_than_parallel(
    tmp_path, shared_url, fleets
):
    fakes = await start_fakes("titan", tokens_per_second=50)
    routes = {"convo": {"hosts": ["titan"], "default_model": MODEL}}
    hosts = {"titan": {"url": fakes["titan"].url, "models": [MODEL], "parallel": 3}}
    fleet = await fleets(tmp_path, shared_url, fakes, routes, hosts=hosts)
    a, b = fleet.instances
    shares = sorted(x.parts.limiter.parallel("titan", MODEL) for x in (a, b))
    assert shares == [1, 2]  # 3 slots: ranks 0 and 1 get 2 and 1
    body = {"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}
    calls = []
    for n in range(12):
        instance = (a, b)[n % 2]
        body = {**body, "messages": [{"role": "user", "content": f"slow {n}"}]}
        calls.append(
            instance.http().post(
                f"{instance.proxy_url}/r/convo/v1/chat/completions",
                data=json.dumps(body).encode(),
            )
        )
    answers = await wait(DeferredList(calls, consumeErrors=True), 30)
    for ok, response in answers:
        assert ok
        await response.content()
    assert fakes["titan"].counters.peak_in_flight == 3
    third = await fleet.add()  # a third instance: 3 slots, 1 each
    await beat_all(fleet.instances)
    await beat_all(fleet.instances)
    assert [x.parts.limiter.parallel("titan", MODEL) for x in (a, b, third)] == [1, 1, 1]
    instances = await a.get("/api/instances")
    assert len(instances["instances"]) == 3 and all(i["alive"] for i in instances["instances"])
    await third.stop()
    await beat_all([a, b])
    assert sorted(x.parts.limiter.parallel("titan", MODEL) for x in (a, b)) == [1, 2]


@pytest_twisted.ensureDeferred
async def test_a_lease_used_on_one_instance_is_not_expired_by_another(tmp_path, shared_url, fleets):
    fleet = await fleets(
        tmp_path, shared_url, await start_fakes("titan"), {"convo": {"hosts": ["titan"]}},
        server={"lease_idle": "2s"},
    )  # fmt: skip
    a, b = fleet.instances
    await a.chat("convo", conversation("kept"))
    (lease,) = a.parts.table.snapshot()
    await within(lambda: len(b.parts.table.snapshot()) == 1, 5)
    # b serves the conversation for a while; a only hears of b's writes of last_used
    started = lease.last_used
    while a.parts.clock.seconds() - started < 2.5:
        await b.chat("convo", conversation("kept"))
    expired = await a.parts.table.expire_idle(a.parts.clock.seconds())
    key = Key("convo", lease.key.fp, lease.key.model)
    assert expired == 0
    assert [x.key for x in a.parts.table.snapshot()] == [key]
    assert [x.key for x in await a.parts.store.list_leases()] == [key]


@pytest_twisted.ensureDeferred
async def test_an_instance_reading_another_config_is_shown_in_the_api_and_metrics(tmp_path):
    fleet = await start_fleet(
        tmp_path, str(tmp_path / "shared.db"), await start_fakes("titan", "atlas"), ROUTES
    )
    a, b = fleet.instances
    try:
        assert (await metric(a, "crossbar_config_mismatch"), await metric(a, "crossbar_instances"))\
            == (0.0, 2.0)  # fmt: skip
        fleet.routes = {**ROUTES, "extra": {"hosts": ["atlas"]}}  # an edit made on one machine
        odd = await fleet.add()
        await beat_all(fleet.instances)
        await beat_all(fleet.instances)
        answer = await a.get("/api/instances")
        matches = {i["id"]: i["config_matches"] for i in answer["instances"]}
        assert matches == {a.parts.instances.id: True, b.parts.instances.id: True,
                           odd.parts.instances.id: False}  # fmt: skip
        assert await metric(a, "crossbar_config_mismatch") == 1.0
        assert await metric(a, "crossbar_instances") == 3.0
        assert await metric(odd, "crossbar_config_mismatch") == 2.0  # seen from the odd one
    finally:
        await fleet.stop()


async def metric(running, name: str) -> float:
    """One unlabelled gauge from the instance's /metrics."""
    response = await running.http().get(f"{running.admin_url}/metrics")
    text = (await response.content()).decode()
    (line,) = [x for x in text.splitlines() if x.startswith(name + " ")]
    return float(line.split()[1])
