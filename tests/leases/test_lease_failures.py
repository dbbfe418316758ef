"""While the store fails, changes that serve clients are kept in memory and written once it
recovers; the operator's are refused and change nothing; a cancelled caller breaks nothing."""

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred, ensureDeferred

from crossbar.leases.journal import StoreUnavailable
from crossbar.leases.table import Key, pin_key
from tests.support.lease_fakes import FailingStore, FakeHosts, HeldStore, hosts_of, make_table

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


KEPT = [new_key, move_off_unhealthy, inherit, touch, new_under_pin, drop_hosts]
REFUSED = [pin, unpin, release, expire]


async def seeded(store):
    hosts = FakeHosts()
    failing = FailingStore(store)
    table = await make_table(failing, hosts)
    await table.acquire(F1, AB, 1.0)  # a
    await table.acquire(Key("convo", "f2", "m"), AB, 1.0)  # b
    await table.acquire(Key("other", "", "m"), ["b", "a"], 1.0)  # b, the route lease
    await table.acquire(Key("pinned", "x", "m"), ["a"], 1.0)
    await table.pin("pinned", "a", 1.0)
    return table, hosts, failing


async def recovery(journal) -> None:
    """Run the journal's next try and wait for the store to be caught up (a real store writes
    in its own thread)."""
    done = Deferred()
    journal.listeners.append(lambda degraded: degraded or done.called or done.callback(None))
    journal.clock.advance(1)
    await done.addTimeout(10, reactor)


async def rows_of(store):
    return {x.key: (x.host, x.last_used) for x in await store.list_leases()}


@pytest.mark.parametrize("change", KEPT)
@pytest_twisted.ensureDeferred
async def test_a_change_that_serves_clients_is_kept_in_memory_while_the_store_fails(store, change):
    table, hosts, failing = await seeded(store)
    before_rows, before_events = await rows_of(store), await store.list_events()
    failing.fail = True
    await change(table, hosts)  # no error: routing goes on from memory
    journal = table.journal
    assert journal.degraded and "injected" in journal.reason
    assert state(table) != state(await make_table(store))  # memory moved on...
    assert (await rows_of(store), await store.list_events()) == (before_rows, before_events)
    changed = {x.key for x in table.snapshot()} ^ set(before_rows) | {
        x.key for x in table.snapshot() if (x.host, x.last_used) != before_rows.get(x.key)
    }
    assert changed and all(journal.unsaved(k) for k in changed - {pin_key("pinned")})
    failing.fail = False
    await recovery(journal)  # the first try after the outage began
    assert not journal.degraded and journal.status()["unsaved_leases"] == 0
    restored = await make_table(store)  # the store now says what memory says
    assert state(restored) == state(table)
    if change is not touch:  # a touch saves last_used and says nothing
        assert len(await store.list_events()) > len(before_events)


@pytest.mark.parametrize("change", REFUSED)
@pytest_twisted.ensureDeferred
async def test_an_operator_change_the_store_cannot_take_is_refused_and_changes_nothing(
    store, change
):
    table, hosts, failing = await seeded(store)
    before, rows, events = state(table), await store.list_leases(), await store.list_events()
    failing.fail = True
    with pytest.raises(StoreUnavailable, match="injected"):
        await change(table, hosts)
    assert state(table) == before
    assert (await store.list_leases(), await store.list_events()) == (rows, events)
    failing.fail = False  # the store works again, but the outage is not over until a try
    with pytest.raises(StoreUnavailable):
        await change(table, hosts)
    await recovery(table.journal)
    await change(table, hosts)  # and the same change works once the store does
    assert state(table) != before


@pytest_twisted.ensureDeferred
async def test_the_store_is_tried_again_with_a_growing_backoff(store):
    table, _, failing = await seeded(store)
    failing.fail = True
    await table.acquire(Key("convo", "f3", "m"), AB, 2.0)
    journal = table.journal
    tries = failing.tries
    for wait in (1, 2, 4, 8, 16, 30, 30):
        journal.clock.advance(wait - 0.01)
        assert failing.tries == tries
        journal.clock.advance(0.01)
        tries += 1
        assert failing.tries == tries and journal.degraded
    failing.fail = False
    journal.clock.advance(29)
    await recovery(journal)


@pytest_twisted.ensureDeferred
async def test_a_kept_write_does_not_hold_the_key_lock(store):
    failing = FailingStore(store, fail=True)
    table = await make_table(failing)
    assert (await table.acquire(F1, AB, 1.0)).host == "a"
    assert (await table.acquire(F1, ["b", "a"], 2.0)).host == "a"  # the kept lease decides
    assert len(table._locks) == 0


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
