"""What the store does for instances sharing it, on SQLite and PostgreSQL alike: conditional
writes that one instance wins, expiry that spares leases used elsewhere, the change log, and
heartbeats."""

import pytest_twisted

from crossbar.leases.types import Change, Key, Lease, State
from crossbar.records import LeaseEvent
from crossbar.store.database import InstanceRow
from tests.support.lease_fakes import open_store

K = Key("convo", "f1", "m")


def lease(host="a", used=1.0, key=K) -> Lease:
    return Lease(key, host, State.ACTIVE, created=1.0, last_used=used)


def new(host: str) -> Change:
    event = LeaseEvent(1.0, K.route, K.fp, K.model, "", host, "new")
    return Change(save=[lease(host)], events=[event], expect=(K, ""))


@pytest_twisted.ensureDeferred
async def test_two_instances_making_the_same_lease_one_wins_and_the_other_learns_its_host(
    shared_url,
):
    first, second = await open_store(shared_url), await open_store(shared_url)
    first.instance, second.instance = "one", "two"
    try:
        won = await first.write(new("a"))
        lost = await second.write(new("b"))
        assert won.applied and won.change_id > 0
        assert not lost.applied and lost.current == lease("a")
        assert await second.list_leases() == [lease("a")]
        assert [e.to_host for e in await second.list_events()] == ["a"]  # the loser's: none
    finally:
        await first.close()
        await second.close()


@pytest_twisted.ensureDeferred
async def test_a_move_holds_only_if_the_lease_is_still_where_the_mover_thinks(store):
    await store.write(new("a"))
    moved = await store.write(Change(save=[lease("b", 2.0)], expect=(K, "c")))
    assert not moved.applied and moved.current == lease("a")
    moved = await store.write(Change(save=[lease("b", 2.0)], expect=(K, "a")))
    assert moved.applied and await store.list_leases() == [lease("b", 2.0)]
    gone = Key("convo", "nobody", "m")
    missing = await store.write(Change(save=[lease("b", key=gone)], expect=(gone, "a")))
    assert not missing.applied and missing.current is None


@pytest_twisted.ensureDeferred
async def test_a_touch_never_winds_last_used_back(store):
    await store.write(Change(save=[lease("a", 50.0)]))
    touched = await store.write(Change(save=[lease("a", 40.0)], expect=(K, "a")))
    assert touched.applied and (await store.list_leases())[0].last_used == 50.0


@pytest_twisted.ensureDeferred
async def test_expiry_spares_a_lease_used_since_on_another_instance(store):
    other = Key("convo", "f2", "m")
    await store.write(Change(save=[lease("a", 10.0), lease("a", 90.0, key=other)]))
    events = [LeaseEvent(100.0, k.route, k.fp, k.model, "a", "", "idle") for k in (K, other)]
    written = await store.write(Change(delete=[K, other], events=events, idle_before=50.0))
    assert written.kept == {other}
    assert [x.key for x in await store.list_leases()] == [other]
    assert [e.fp for e in await store.list_events()] == ["f1"]  # an event only for what went


@pytest_twisted.ensureDeferred
async def test_every_change_is_in_the_log_numbered_in_order_with_its_writer(store):
    store.instance = "one"
    assert await store.last_change() == 0
    await store.write(new("a"))
    await store.write(Change(delete=[K]))
    await store.set_draining("titan", True)
    rows = await store.changes_since(0)
    assert [r.id for r in rows] == [1, 2, 3] and await store.last_change() == 3
    assert {r.instance for r in rows} == {"one"}
    assert [(r.kind, r.route, r.host) for r in rows] == [
        ("lease", "convo", "a"),
        ("lease", "convo", ""),
        ("drain", "titan", "titan"),
    ]
    assert rows[0].lease() == lease("a") and rows[1].lease() is None
    assert [r.id for r in await store.changes_since(2)] == [3]


@pytest_twisted.ensureDeferred
async def test_heartbeats_use_the_databases_clock_and_list_every_instance(store):
    row = InstanceRow("one", "127.0.0.1:8080", "0.1.0", "d1", 5.0, 0.0, 3)
    now, rows = await store.heartbeat(row)
    assert now > 1_700_000_000  # seconds since the epoch, from the database
    assert [(r.id, r.in_flight, r.heartbeat) for r in rows] == [("one", 3, now)]
    _, rows = await store.heartbeat(InstanceRow("two", "x", "0.1.0", "d1", 6.0, 0.0, 0))
    assert [r.id for r in rows] == ["one", "two"]
    await store.forget_instance("one")
    _, rows = await store.heartbeat(InstanceRow("two", "x", "0.1.0", "d1", 6.0, 0.0, 0))
    assert [r.id for r in rows] == ["two"]
