"""Acquire, step by step: pin, then the key's own lease, then the route lease, then the chooser."""

import pytest
import pytest_twisted

from crossbar.leases.table import Acquired, Key, Lease, NoHost, PinnedDown, State, Table
from tests.support.lease_fakes import FakeHosts, MemoryStore, hosts_of, make_table, run_now, story

K = Key("convo", "f1", "m")
AB = ["a", "b"]


# -- 4. choose --------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_new_key_gets_the_chosen_host_and_a_new_event(store):
    table = await make_table(store)
    assert await table.acquire(K, AB, 10.0) == Acquired("a", reused=False, pinned=False)
    assert hosts_of(table) == {("convo", "f1", "m"): "a"}
    assert await store.list_leases() == [Lease(K, "a", State.ACTIVE, 10.0, 10.0)]
    assert await story(store) == [("new", "convo", "f1", "", "a")]


@pytest_twisted.ensureDeferred
async def test_new_leases_spread_by_load(store):
    table = await make_table(store)
    got = [(await table.acquire(Key("convo", fp, "m"), AB, 1.0)).host for fp in "wxyz"]
    assert got == ["a", "b", "a", "b"]
    assert (table.count("a", "m"), table.count("b", "m"), table.count("a", "other")) == (2, 2, 0)


@pytest_twisted.ensureDeferred
async def test_no_usable_host_raises_no_host_and_creates_and_writes_nothing(store):
    table = await make_table(store, FakeHosts(down={"a"}, drained={"b"}))
    with pytest.raises(NoHost, match="no usable host for route 'convo', model 'm'"):
        await table.acquire(K, AB, 1.0)
    with pytest.raises(NoHost):
        await table.acquire(K, [], 1.0)
    assert table.snapshot() == [] and await store.list_leases() == []
    assert await story(store) == []


@pytest_twisted.ensureDeferred
async def test_a_new_lease_takes_the_host_its_conversation_is_warm_on_over_the_chooser(store):
    table = await make_table(store)
    await table.acquire(Key("convo", "f0", "m"), AB, 1.0)  # a, so the chooser would say b
    assert await table.acquire(K, AB, 2.0, warm="a") == Acquired("a", reused=False, pinned=False)
    assert (await story(store))[-1] == ("new", "convo", "f1", "", "a")


@pytest_twisted.ensureDeferred
async def test_a_warm_host_that_is_down_draining_or_not_a_candidate_leaves_it_to_the_chooser(
    store,
):
    hosts = FakeHosts(down={"a"}, drained={"c"})
    table = await make_table(store, hosts)
    for fp, warm in (("f1", "a"), ("f2", "c"), ("f3", "z")):
        got = await table.acquire(Key("convo", fp, "m"), ["a", "b", "c"], 1.0, warm=warm)
        assert got == Acquired("b", reused=False, pinned=False)


@pytest_twisted.ensureDeferred
async def test_a_warm_host_never_outranks_an_own_lease_the_route_lease_or_a_pin(store):
    table = await make_table(store)
    await table.acquire(K, AB, 1.0)  # own lease on a
    assert await table.acquire(K, AB, 2.0, warm="b") == Acquired("a", reused=True, pinned=False)
    await table.acquire(Key("convo", "", "m"), ["b", "a"], 2.0)  # the route lease: b
    f2 = Key("convo", "f2", "m")
    assert await table.acquire(f2, AB, 3.0, warm="a") == Acquired("b", reused=True, pinned=False)
    await table.pin("convo", "b", 4.0)
    f3 = Key("convo", "f3", "m")
    assert await table.acquire(f3, AB, 5.0, warm="a") == Acquired("b", reused=False, pinned=True)


# -- 2. the key's own lease -----------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_an_existing_lease_on_a_healthy_host_is_reused_without_an_event(store):
    table = await make_table(store)
    await table.acquire(K, AB, 1.0)
    assert await table.acquire(K, ["b", "a"], 2.0) == Acquired("a", reused=True, pinned=False)
    assert await story(store) == [("new", "convo", "f1", "", "a")]


@pytest_twisted.ensureDeferred
async def test_a_draining_host_keeps_its_leases_but_gets_no_new_ones(store):
    hosts = FakeHosts()
    table = await make_table(store, hosts)
    await table.acquire(K, AB, 1.0)
    hosts.drained.add("a")
    assert (await table.acquire(K, AB, 2.0)).host == "a"
    assert (await table.acquire(Key("convo", "f2", "m"), AB, 2.0)).host == "b"
    assert (await table.acquire(Key("convo", "f3", "m"), AB, 2.0)).host == "b"


@pytest_twisted.ensureDeferred
async def test_a_lease_on_an_unhealthy_host_moves_with_an_unhealthy_event(store):
    hosts = FakeHosts()
    table = await make_table(store, hosts)
    await table.acquire(K, AB, 1.0)
    hosts.down.add("a")
    assert await table.acquire(K, AB, 2.0) == Acquired("b", reused=False, pinned=False)
    hosts.down.clear()  # a coming back moves nobody
    assert (await table.acquire(K, AB, 3.0)).host == "b"
    assert await story(store) == [
        ("new", "convo", "f1", "", "a"),
        ("unhealthy", "convo", "f1", "a", "b"),
    ]
    assert (table.count("a", "m"), table.count("b", "m")) == (0, 1)


@pytest_twisted.ensureDeferred
async def test_an_unhealthy_lease_with_nowhere_to_go_stays(store):
    hosts = FakeHosts()
    table = await make_table(store, hosts)
    await table.acquire(K, ["a"], 1.0)
    hosts.down.add("a")
    with pytest.raises(NoHost):
        await table.acquire(K, ["a"], 2.0)
    hosts.down.clear()
    assert await table.acquire(K, ["a"], 3.0) == Acquired("a", reused=True, pinned=False)
    assert await story(store) == [("new", "convo", "f1", "", "a")]


@pytest_twisted.ensureDeferred
async def test_a_lease_on_a_host_the_route_no_longer_lists_moves_with_reason_config(store):
    table = await make_table(store)
    await table.acquire(K, AB, 1.0)
    assert (await table.acquire(K, ["b"], 2.0)).host == "b"
    assert (await story(store))[-1] == ("config", "convo", "f1", "a", "b")


# -- 3. inherit the route lease -------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_conversation_inherits_the_route_lease_for_its_model(store):
    table = await make_table(store)
    await table.acquire(Key("convo", "f0", "m"), AB, 1.0)  # a, so the chooser would say b
    await table.acquire(Key("convo", "", "m"), ["b", "a"], 1.0)  # the route lease: b
    assert await table.acquire(K, AB, 2.0) == Acquired("b", reused=True, pinned=False)
    assert (await story(store))[-1] == ("new", "convo", "f1", "", "b")
    # another model has no route lease: the chooser decides
    assert (await table.acquire(Key("convo", "f1", "n"), AB, 2.0)).reused is False


@pytest_twisted.ensureDeferred
async def test_a_route_lease_on_an_unhealthy_or_draining_host_is_not_inherited(store):
    hosts = FakeHosts()
    table = await make_table(store, hosts)
    await table.acquire(Key("convo", "", "m"), AB, 1.0)  # on a
    hosts.down.add("a")
    assert await table.acquire(K, AB, 2.0) == Acquired("b", reused=False, pinned=False)
    hosts.down.clear()
    hosts.drained.add("a")
    assert (await table.acquire(Key("convo", "f2", "m"), AB, 2.0)).host == "b"


@pytest_twisted.ensureDeferred
async def test_a_lease_leaving_an_unhealthy_host_may_land_on_the_route_lease(store):
    hosts = FakeHosts()
    table = await make_table(store, hosts)
    await table.acquire(K, AB, 1.0)  # a
    await table.acquire(Key("convo", "", "m"), AB, 1.0)  # b
    hosts.down.add("a")
    assert await table.acquire(K, AB, 2.0) == Acquired("b", reused=True, pinned=False)
    assert (await story(store))[-1] == ("unhealthy", "convo", "f1", "a", "b")


# -- 1. the pin -----------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_pinned_route_goes_to_its_pin_and_says_so(store):
    table = await make_table(store)
    await table.acquire(K, AB, 1.0)  # seen a and b
    await table.pin("convo", "b", 2.0)
    f2 = Key("convo", "f2", "m")
    assert await table.acquire(f2, AB, 3.0) == Acquired("b", reused=False, pinned=True)
    assert await table.acquire(f2, AB, 4.0) == Acquired("b", reused=True, pinned=True)
    assert (await story(store))[-1] == ("new", "convo", "f2", "", "b")


@pytest_twisted.ensureDeferred
async def test_a_pin_outranks_draining(store):
    hosts = FakeHosts(drained={"b"})
    table = await make_table(store, hosts)
    await table.acquire(K, AB, 1.0)
    await table.pin("convo", "b", 2.0)
    assert (await table.acquire(K, AB, 3.0)).host == "b"


@pytest_twisted.ensureDeferred
async def test_a_pinned_host_that_is_down_raises_pinned_down_and_moves_nobody(store):
    hosts = FakeHosts()
    table = await make_table(store, hosts)
    await table.acquire(K, AB, 1.0)
    await table.pin("convo", "a", 2.0)
    hosts.down.add("a")
    before = await story(store)
    with pytest.raises(PinnedDown, match="pinned to host 'a', which is not healthy") as caught:
        await table.acquire(K, AB, 3.0)
    assert caught.value.host == "a"
    with pytest.raises(PinnedDown):
        await table.acquire(Key("convo", "new", "m"), AB, 3.0)
    assert hosts_of(table) == {("convo", "f1", "m"): "a"}
    assert await story(store) == before


@pytest_twisted.ensureDeferred
async def test_a_pin_host_that_does_not_serve_the_model_leaves_it_to_the_other_steps(store):
    table = await make_table(store)
    await table.acquire(K, AB, 1.0)
    await table.pin("convo", "b", 2.0)
    only_a = Key("convo", "f1", "n")  # model n: a serves it, b does not
    assert await table.acquire(only_a, ["a"], 3.0) == Acquired("a", reused=False, pinned=False)


def test_a_lease_that_raced_a_pin_moves_to_the_pin():
    # A lease created while a pin was being written can outlive the pin's sweep of the route.
    store = MemoryStore()
    store.rows[K] = Lease(K, "a", State.ACTIVE, 1.0, 1.0)
    pin = Key("convo", "", "")
    store.rows[pin] = Lease(pin, "b", State.PINNED, 1.0, 1.0)
    table = run_now(make_table(store))
    assert run_now(table.acquire(K, AB, 2.0)) == Acquired("b", reused=False, pinned=True)
    assert store.rows[K].host == "b"
    assert [(e.reason, e.from_host, e.to_host) for e in store.events] == [("pin", "a", "b")]


def test_a_lease_key_needs_a_model():
    table = run_now(Table.load(MemoryStore(), FakeHosts(), None, 60.0))
    with pytest.raises(ValueError, match="needs a model"):
        run_now(table.acquire(Key("convo", "", ""), AB, 1.0))


# -- last_used ------------------------------------------------------------------------------


def test_reuse_saves_last_used_only_once_it_advanced_past_the_touch_interval():
    # idle 1000 s: the interval is min(60, 1000 / 100) = 10 s.
    store = MemoryStore()
    table = run_now(make_table(store, idle=1000.0))
    run_now(table.acquire(K, AB, 100.0))
    run_now(table.acquire(K, AB, 110.0))
    assert (store.rows[K].last_used, table.snapshot()[0].last_used) == (100.0, 110.0)
    run_now(table.acquire(K, AB, 110.5))
    assert store.rows[K].last_used == 110.5
    assert store.events[-1].reason == "new"  # touching writes no event


def test_expiry_reads_last_used_from_memory_not_from_the_store():
    store = MemoryStore()
    table = run_now(make_table(store, idle=1000.0))
    run_now(table.acquire(K, AB, 0.0))
    run_now(table.acquire(K, AB, 5.0))  # not saved (under 10 s)
    assert run_now(table.expire_idle(1004.0)) == 0
    assert run_now(table.expire_idle(1005.5)) == 1
