"""Pin, unpin, release, idle expiry, removed hosts, and a restart that moves nobody."""

import pytest
import pytest_twisted

from crossbar.leases.table import Acquired, Key, Lease, State, UnknownHost
from tests.support.lease_fakes import FakeHosts, hosts_of, make_table, open_store, story

AB = ["a", "b"]


async def spread(table, now=1.0):
    """convo/f1 on a, convo/f2 on b, convo/f3 on a; other/g on b."""
    for fp in ("f1", "f2", "f3"):
        await table.acquire(Key("convo", fp, "m"), AB, now)
    await table.acquire(Key("other", "g", "m"), ["b"], now)


# -- pin and unpin --------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_pin_deletes_the_route_leases_on_other_hosts_and_saves_a_pin_row(store):
    table = await make_table(store)
    await spread(table)
    before = len(await story(store))
    await table.pin("convo", "b", 5.0)
    assert table.pinned("convo") == "b" and table.pins() == {"convo": "b"}
    assert hosts_of(table) == {("convo", "f2", "m"): "b", ("other", "g", "m"): "b"}
    assert (await story(store))[before:] == [
        ("pin", "convo", "", "", "b"),
        ("pin", "convo", "f1", "a", "b"),
        ("pin", "convo", "f3", "a", "b"),
    ]
    pin_row = Lease(Key("convo", "", ""), "b", State.PINNED, 5.0, 5.0)
    assert pin_row in await store.list_leases()
    assert table.snapshot(route="convo")[0].key.fp == "f2"  # the pin is no lease
    assert (table.count("a", "m"), table.count("b", "m")) == (0, 2)


@pytest_twisted.ensureDeferred
async def test_pinning_again_writes_only_what_changes(store):
    table = await make_table(store)
    await spread(table)
    await table.pin("convo", "b", 5.0)
    n = len(await story(store))
    await table.pin("convo", "b", 6.0)
    assert len(await story(store)) == n
    await table.pin("convo", "a", 7.0)
    assert (await story(store))[n:] == [
        ("pin", "convo", "", "b", "a"),
        ("pin", "convo", "f2", "b", "a"),
    ]


@pytest_twisted.ensureDeferred
async def test_unpin_deletes_the_pin_and_keeps_the_leases(store):
    table = await make_table(store)
    await spread(table)
    await table.pin("convo", "b", 5.0)
    await table.unpin("convo", 6.0)
    assert table.pinned("convo") is None and table.pins() == {}
    assert hosts_of(table)[("convo", "f2", "m")] == "b"
    assert (await story(store))[-1] == ("release", "convo", "", "b", "")
    assert all(row.state is State.ACTIVE for row in await store.list_leases())
    f9 = Key("convo", "f9", "m")
    assert await table.acquire(f9, AB, 7.0) == Acquired("a", reused=False, pinned=False)


@pytest_twisted.ensureDeferred
async def test_unpin_of_an_unpinned_route_writes_nothing(store):
    table = await make_table(store)
    await table.unpin("convo", 1.0)
    assert await story(store) == []


@pytest_twisted.ensureDeferred
async def test_pin_to_a_host_never_a_candidate_of_the_route_raises_unknown_host(store):
    table = await make_table(store)
    await spread(table)
    with pytest.raises(UnknownHost, match="host 'c' is not one of the hosts of route 'convo'"):
        await table.pin("convo", "c", 2.0)
    with pytest.raises(UnknownHost):
        await table.pin("other", "a", 2.0)  # a is convo's, not other's
    with pytest.raises(UnknownHost):
        await table.pin("never-seen", "a", 2.0)
    assert table.pins() == {}


@pytest_twisted.ensureDeferred
async def test_a_candidate_counts_as_seen_even_if_it_never_got_a_lease(store):
    table = await make_table(store)
    await table.acquire(Key("convo", "f1", "m"), ["a", "c"], 1.0)
    await table.pin("convo", "c", 2.0)
    assert table.pinned("convo") == "c"


@pytest_twisted.ensureDeferred
async def test_after_a_restart_hosts_of_stored_leases_count_as_seen(tmp_path):
    path = str(tmp_path / "crossbar.db")
    first = await open_store(path)
    table = await make_table(first)
    await spread(table)
    await first.close()
    second = await open_store(path)
    try:
        table = await make_table(second)
        await table.pin("convo", "b", 2.0)  # seen: convo held leases on a and b
        with pytest.raises(UnknownHost):
            await table.pin("other", "a", 2.0)
    finally:
        await second.close()


# -- release, expiry, removed hosts ---------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_release_drops_every_lease_of_the_route_but_not_its_pin(store):
    table = await make_table(store)
    await spread(table)
    await table.pin("convo", "a", 2.0)
    n = len(await story(store))
    assert await table.release("convo", 3.0) == 2
    assert hosts_of(table) == {("other", "g", "m"): "b"}
    assert table.pinned("convo") == "a"
    assert (await story(store))[n:] == [
        ("release", "convo", "f1", "a", ""),
        ("release", "convo", "f3", "a", ""),
    ]
    assert await table.release("convo", 4.0) == 0
    assert len(await story(store)) == n + 2


@pytest_twisted.ensureDeferred
async def test_expire_idle_drops_leases_idle_longer_than_idle_and_never_pins(store):
    table = await make_table(store, idle=100.0)
    await table.acquire(Key("convo", "old", "m"), AB, 0.0)
    await table.pin("convo", "a", 0.0)
    await table.acquire(Key("convo", "young", "m"), AB, 50.0)
    assert await table.expire_idle(100.0) == 0  # exactly idle is not longer than idle
    assert await table.expire_idle(100.5) == 1
    assert hosts_of(table) == {("convo", "young", "m"): "a"}
    assert (await story(store))[-1] == ("idle", "convo", "old", "a", "")
    assert await table.expire_idle(1e9) == 1
    assert table.pinned("convo") == "a"
    assert len(await store.list_leases()) == 1  # the pin row


@pytest_twisted.ensureDeferred
async def test_drop_hosts_drops_leases_and_pins_of_removed_hosts(store):
    table = await make_table(store)
    await spread(table)
    await table.pin("other", "b", 2.0)
    assert await table.drop_hosts({"b"}, 3.0) == 2
    assert hosts_of(table) == {("convo", "f1", "m"): "a", ("convo", "f3", "m"): "a"}
    assert table.pins() == {}
    assert sorted((await story(store))[-3:]) == [
        ("config", "convo", "f2", "b", ""),
        ("config", "other", "", "b", ""),
        ("config", "other", "g", "b", ""),
    ]
    with pytest.raises(UnknownHost):  # a removed host is no longer a seen candidate
        await table.pin("convo", "b", 4.0)
    assert await table.drop_hosts({"nope"}, 5.0) == 0


# -- reading the table ----------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_snapshot_is_sorted_copies_without_pins(store):
    table = await make_table(store)
    for key in [Key("b", "x", "m"), Key("a", "y", "m"), Key("a", "x", "n"), Key("a", "x", "m")]:
        await table.acquire(key, ["a"], 1.0)
    await table.pin("a", "a", 1.0)
    snap = table.snapshot()
    assert [(x.key.route, x.key.fp, x.key.model) for x in snap] == [
        ("a", "x", "m"),
        ("a", "x", "n"),
        ("a", "y", "m"),
        ("b", "x", "m"),
    ]
    snap[0].host = "zzz"
    assert table.snapshot()[0].host != "zzz"
    assert [x.key.route for x in table.snapshot(route="b")] == ["b"]


@pytest_twisted.ensureDeferred
async def test_hosts_with_lease_names_the_hosts_of_the_given_routes_for_a_model(store):
    table = await make_table(store)
    await spread(table)
    assert table.hosts_with_lease(["convo"], "m") == {"a", "b"}
    assert table.hosts_with_lease(["other"], "m") == {"b"}
    assert table.hosts_with_lease(["other", "nobody"], "n") == set()
    await table.release("convo", 2.0)
    assert table.hosts_with_lease(["convo"], "m") == set()


# -- restart --------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_table_loaded_from_the_same_file_returns_the_same_hosts(tmp_path):
    path = str(tmp_path / "crossbar.db")
    first = await open_store(path)
    table = await make_table(first)
    await spread(table)
    await table.pin("other", "b", 2.0)
    answers = {
        key: await table.acquire(key, AB, 3.0)
        for key in [Key("convo", fp, "m") for fp in ("f1", "f2", "f3")] + [Key("other", "g", "m")]
    }
    before = (hosts_of(table), table.pins())
    await first.close()

    second = await open_store(path)
    try:
        # Built in another order and with the hosts reversed: still nobody moves.
        reloaded = await make_table(second, FakeHosts())
        # last_used is saved lazily (see Table._touch_every), so compare where, not when.
        assert (hosts_of(reloaded), reloaded.pins()) == before
        for key in reversed(list(answers)):
            assert await reloaded.acquire(key, list(reversed(AB)), 4.0) == answers[key]
        assert reloaded.count("a", "m") == table.count("a", "m")
    finally:
        await second.close()


@pytest_twisted.ensureDeferred
async def test_a_loaded_table_counts_and_indexes_as_the_table_that_wrote_it(tmp_path):
    """Table.load builds its indexes in bulk: they must say what the writing table's say."""
    path = str(tmp_path / "crossbar.db")
    first = await open_store(path)
    table = await make_table(first)
    await spread(table)
    await table.acquire(Key("convo", "f4", "n"), ["b"], 1.0)
    await table.pin("other", "b", 2.0)
    await first.close()
    second = await open_store(path)
    try:
        loaded = await make_table(second)
        for host in AB:
            for model in ("m", "n"):
                assert loaded.count(host, model) == table.count(host, model)
        for routes in (["convo"], ["other"], ["convo", "other"]):
            for model in ("m", "n"):
                assert loaded.hosts_with_lease(routes, model) == table.hosts_with_lease(
                    routes, model
                )
        assert loaded.snapshot() == table.snapshot()
        assert loaded.snapshot("convo") == table.snapshot("convo")
        assert loaded.pins() == {"other": "b"}
        await loaded.pin("convo", "b", 3.0)  # a host the route's leases were seen on
        assert (loaded.count("a", "m"), loaded.count("b", "m")) == (0, 2)  # f1, f3 deleted
    finally:
        await second.close()


def test_the_operators_changes_are_written_durably_and_requests_are_not():
    from tests.support.lease_fakes import MemoryStore, make_table, run_now

    store = MemoryStore()
    table = run_now(make_table(store))
    table.note_candidates("convo", ["a", "b"])
    run_now(table.acquire(Key("convo", "f1", "m"), ["a", "b"], 1.0))
    assert store.durable == [False]
    run_now(table.pin("convo", "b", 2.0))
    run_now(table.unpin("convo", 3.0))
    run_now(table.acquire(Key("convo", "f2", "m"), ["a", "b"], 3.5))
    run_now(table.release("convo", 4.0))
    assert store.durable == [False, True, True, False, True]
    run_now(table.acquire(Key("convo", "f3", "m"), ["a", "b"], 5.0))
    run_now(table.expire_idle(1e9))
    assert store.durable[5:] == [False, False]
