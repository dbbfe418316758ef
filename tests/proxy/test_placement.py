"""Placement under real load: conversations that arrive together spread as if one by one, right
after start and across instances; a request nobody could serve places nothing."""

import json
from collections import Counter

import pytest_twisted
from twisted.internet.defer import DeferredList, ensureDeferred

from tests.support.admin_harness import conversation, start_service, write_config
from tests.support.fleet import start_fleet, within
from tests.support.harness import MODEL, host_table, start_fakes, wait

HOSTS = ("h0", "h1", "h2")
ROUTES = {"convo": {"hosts": list(HOSTS), "default_model": MODEL}}


async def burst(instances, n: int, tag: str) -> Counter:
    """`n` new conversations sent at once, spread over `instances` in turn; where each went."""
    calls = [
        ensureDeferred(instances[i % len(instances)].chat("convo", conversation(f"{tag}{i}")))
        for i in range(n)
    ]
    results = await wait(DeferredList(calls, consumeErrors=True), 30)
    failed = [r for ok, r in results if not ok]
    assert not failed, failed[0]
    return Counter(host for _, (host, _) in results)


def even(counts: Counter, total: int) -> bool:
    return even_over(counts, HOSTS, total)


def even_over(counts: Counter, hosts, total: int) -> bool:
    """Every one of `total` placed on `hosts`, none holding more than 2 above another."""
    per_host = [counts.get(h, 0) for h in hosts]
    return sum(per_host) == total and max(per_host) - min(per_host) <= 2


async def fakes_with_discovered_slots():
    # Slow enough that requests overlap; the slots are read from each fake's /props.
    return await start_fakes(*HOSTS, parallel=4, tokens_per_second=400)


@pytest_twisted.ensureDeferred
async def test_thirty_conversations_at_once_right_after_start_spread_evenly(
    tmp_path, shared_url, serve
):
    fakes = await fakes_with_discovered_slots()
    path = write_config(
        tmp_path / "c.toml", fakes, ROUTES, server={"db": shared_url}, hosts=host_table(fakes)
    )
    running = await serve(path, fakes)  # every host probed before the port opened
    assert all(running.parts.hosts.knows_parallel(h, MODEL) for h in HOSTS)
    first = await burst([running], 30, "first")
    assert even(first, 30), first
    # In steady state too: a second burst over hosts already holding ten leases each.
    second = await burst([running], 30, "second")
    assert even(second, 30), second
    held = Counter(x.host for x in running.parts.table.snapshot())
    assert even(held, 60), held
    assert running.parts.table.placing("h0", MODEL) == 0  # every reservation given back


@pytest_twisted.ensureDeferred
async def test_thirty_conversations_at_once_over_two_instances_spread_evenly(tmp_path, shared_url):
    fakes = await fakes_with_discovered_slots()
    fleet = await start_fleet(tmp_path, shared_url, fakes, ROUTES, hosts=host_table(fakes))
    try:
        counts = await burst(fleet.instances, 30, "both")
        assert even(counts, 30), counts
    finally:
        await fleet.stop()


async def post(running, body: bytes) -> tuple[int, dict]:
    response = await wait(
        running.http().post(
            f"{running.proxy_url}/r/convo/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
    )
    return response.code, await wait(response.json())


@pytest_twisted.ensureDeferred
async def test_junk_requests_leave_no_lease_and_new_conversations_still_spread(tmp_path):
    fakes = await fakes_with_discovered_slots()
    running = await start_service(write_config(tmp_path / "c.toml", fakes, ROUTES), fakes)
    try:
        table = running.parts.table
        # Bodies that name no conversation: the host refuses one, answers the other.
        assert (await post(running, b'{"messages": 5}'))[0] == 400
        assert (await post(running, b'{"messages": []}'))[0] in (200, 400)
        # A conversation the host refuses (a 4xx): the lease it made goes again.
        opening = conversation("refused")
        bad = {"model": MODEL, "messages": opening, "stream": "yes"}
        status, answer = await post(running, json.dumps(bad).encode())
        assert status == 400, answer
        await within(lambda: table.snapshot() == [], 5)  # forgotten once the answer has gone
        events = await running.parts.store.list_events()
        assert [e.reason for e in events if e.fp] == ["refused", "new"]  # newest first
        # Nothing was left for new conversations to inherit: they spread.
        counts = await burst([running], 6, "after")
        assert counts == Counter({"h0": 2, "h1": 2, "h2": 2}), counts
        assert {x.key.fp for x in table.snapshot()} != {""}
        assert len(table.snapshot()) == 6
    finally:
        await running.stop()


def long_opening(name: str) -> list[dict[str, str]]:
    """A conversation whose prompt is long enough (over MIN_LOST tokens) that losing it
    counts."""
    words = " ".join(f"{name}{i}" for i in range(200))
    return [{"role": "user", "content": f"Conversation {name}: {words}"}]


@pytest_twisted.ensureDeferred
async def test_an_eviction_is_counted_and_the_cold_conversation_moves_at_its_next_turn(
    tmp_path, serve
):
    # One slot each and no idle caches: a host keeps one conversation warm at a time.
    fakes = await start_fakes("titan", "atlas", parallel=1, cache_slots=0)
    routes = {"convo": {"hosts": ["titan", "atlas"], "default_model": MODEL}}
    running = await serve(write_config(tmp_path / "c.toml", fakes, routes), fakes)
    hosts, store = running.parts.hosts, running.parts.store
    await hosts.drain("atlas")  # both conversations start on titan
    a, b = long_opening("a"), long_opening("b")
    assert (await running.chat("convo", a))[0] == "titan"
    assert (await running.chat("convo", b))[0] == "titan"  # b takes titan's one slot
    await hosts.undrain("atlas")
    a2 = [*a, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    assert (await running.chat("convo", a2))[0] == "titan"  # its lease decides; a is cold
    cache = (await running.get("/api/hosts"))["hosts"][0]["cache"]
    assert (cache["evictions"], cache["kept_turns"]) == (1, 0)
    assert cache["warm_capacity_source"] == "learned" and cache["warm_capacity"] > 0
    # It pays the prefill wherever its next turn goes: there, it moves to the host with
    # room to keep it warm.
    a3 = [*a2, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]
    assert (await running.chat("convo", a3))[0] == "atlas"
    moves = [(e.reason, e.from_host, e.to_host) for e in await store.list_events() if e.fp]
    assert moves[0] == ("cold", "titan", "atlas")
    # b had lost titan's slot to a's second turn: cold too, but titan, which a left, is
    # now the best place for it; it stays, and from then on titan keeps it.
    b2 = [*b, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    assert (await running.chat("convo", b2))[0] == "titan"
    b3 = [*b2, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]
    assert (await running.chat("convo", b3))[0] == "titan"
    metrics = (await running.call("GET", "/metrics"))[1]
    assert 'crossbar_cache_evictions_total{host="titan"} 2.0' in metrics
    assert 'crossbar_cache_kept_turns_total{host="titan"} 1.0' in metrics
    assert 'crossbar_cache_kept_turns_total{host="atlas"} 0.0' in metrics


@pytest_twisted.ensureDeferred
async def test_a_reload_probes_the_hosts_it_adds_before_anything_is_placed_on_them(tmp_path, serve):
    fakes = await fakes_with_discovered_slots()
    routes = {"convo": {"hosts": ["h0", "h1"], "default_model": MODEL}}
    two = {name: fakes[name] for name in ("h0", "h1")}
    path = write_config(tmp_path / "c.toml", two, routes, hosts=host_table(two))
    running = await serve(path, fakes)
    assert even_over(await burst([running], 4, "before"), ("h0", "h1"), 4)
    write_config(path, fakes, ROUTES, hosts=host_table(fakes))
    code, answer, _ = await running.call("POST", "/api/reload")
    assert code == 200, answer
    # Probed while the reload ran: its slots are known, nothing about it is a guess.
    assert running.parts.hosts.knows_parallel("h2", MODEL)
    assert running.parts.hosts.parallel("h2", MODEL) == 4
    # The new host is the least loaded: the next conversations go there first.
    assert await burst([running], 2, "after") == Counter({"h2": 2})
