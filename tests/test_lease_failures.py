"""A write that fails leaves the table as it was and raises; a cancelled caller breaks nothing."""

import pytest
import pytest_twisted
from lease_fakes import FailingStore, FakeHosts, HeldStore, hosts_of, make_table
from twisted.internet.defer import CancelledError, ensureDeferred

from crossbar.lease import Key
from crossbar.store import StoreError

AB = ["a", "b"]
F1 = Key("convo", "f1", "m")


def state(table):
    counts = {(h, m): table.count(h, m) for h in "ab" for m in ("m", "n")}
    return table.snapshot(), table.pins(), counts, table.hosts_with_lease(["convo"], "m")


async def new_key(table, hosts):
    await table.acquire(Key("convo", "f9", "m"), AB, 2.0)


async def move_off_unhealthy(table, hosts):
    hosts.down.add("a")
    await table.acquire(F1, AB, 2.0)


async def inherit(table, hosts):
    await table.acquire(Key("other", "f", "m"), ["a", "b"], 2.0)


async def touch(table, hosts):
    await table.acquire(F1, AB, 1000.0)  # past the touch interval: last_used is saved


async def new_under_pin(table, hosts):
    await table.acquire(Key("pinned", "f", "m"), AB, 2.0)


async def pin(table, hosts):
    await table.pin("convo", "b", 2.0)


async def unpin(table, hosts):
    await table.unpin("pinned", 2.0)


async def release(table, hosts):
    await table.release("convo", 2.0)


async def expire(table, hosts):
    await table.expire_idle(1e9)


async def drop_hosts(table, hosts):
    await table.drop_hosts({"a"}, 2.0)


CHANGES = [new_key, move_off_unhealthy, inherit, touch, new_under_pin]
CHANGES += [pin, unpin, release, expire, drop_hosts]


@pytest.mark.parametrize("change", CHANGES)
@pytest_twisted.ensureDeferred
async def test_a_failed_write_leaves_memory_and_store_unchanged_and_raises(store, change):
    hosts = FakeHosts()
    failing = FailingStore(store)
    table = await make_table(failing, hosts)
    await table.acquire(F1, AB, 1.0)  # a
    await table.acquire(Key("convo", "f2", "m"), AB, 1.0)  # b
    await table.acquire(Key("other", "", "m"), ["b", "a"], 1.0)  # b, the route lease
    await table.acquire(Key("pinned", "x", "m"), ["a"], 1.0)
    await table.pin("pinned", "a", 1.0)
    before, rows, events = state(table), await store.list_leases(), await store.list_events()
    failing.fail = True
    with pytest.raises(StoreError, match="injected"):
        await change(table, hosts)
    assert state(table) == before
    assert (await store.list_leases(), await store.list_events()) == (rows, events)
    failing.fail = False
    await change(table, hosts)  # and the same change works once the store does
    assert failing.writes > 0 and state(table) != before


@pytest_twisted.ensureDeferred
async def test_a_failed_write_does_not_hold_the_key_lock(store):
    failing = FailingStore(store, fail=True)
    table = await make_table(failing)
    with pytest.raises(StoreError):
        await table.acquire(F1, AB, 1.0)
    failing.fail = False
    assert (await table.acquire(F1, AB, 2.0)).host == "a"


@pytest_twisted.ensureDeferred
async def test_a_cancelled_acquire_still_applies_the_write_it_started(store):
    # A client that leaves while its lease is being written: the store gets the lease, so
    # memory must too, and the next caller for the key waits for it rather than racing it.
    held = HeldStore(store)
    table = await make_table(held)
    first = ensureDeferred(table.acquire(F1, AB, 1.0))
    assert len(held.held) == 1
    finished = []
    first.addBoth(lambda result: finished.append(result) or result)
    first.cancel()
    second = ensureDeferred(table.acquire(F1, ["b", "a"], 2.0))
    assert finished == [] and not second.called  # first waits for its write to land
    held.let_go()
    with pytest.raises(CancelledError):
        await first
    got = await second
    assert (got.host, got.reused) == ("a", True)
    assert hosts_of(table) == {("convo", "f1", "m"): "a"}
    assert [(x.key, x.host) for x in await store.list_leases()] == [(F1, "a")]
    assert len(await store.list_events()) == 1
