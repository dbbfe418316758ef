"""The store's write path and read path: lease changes and usage rows that arrive together go in
one transaction (group commit), each keeping its own result; the admin API's reports run on a
connection of their own, so they neither wait behind lease writes nor hold them up."""

from __future__ import annotations

import threading

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import DeferredList, ensureDeferred
from twisted.internet.threads import deferToThreadPool

from crossbar.leases.table import Key, Lease, State
from crossbar.leases.types import Change
from crossbar.records import LeaseEvent, UsageRow
from crossbar.store.database import StoreError
from tests.support.lease_fakes import open_store


def new_lease(fp: str) -> Change:
    key = Key("r", fp, "m")
    lease = Lease(key, "a", State.ACTIVE, 1.0, 1.0)
    event = LeaseEvent(1.0, "r", fp, "m", "", "a", "new")
    return Change(save=[lease], events=[event], expect=(key, ""))


def usage(fp: str) -> UsageRow:
    return UsageRow(1.0, "r", fp, "m", "a", "/v1/chat/completions", status=200, stream=False)


@pytest_twisted.ensureDeferred
async def test_writes_arriving_together_share_one_transaction(store):
    before = store.group.groups
    writes = [ensureDeferred(store.write(new_lease(f"c{i}"))) for i in range(200)]
    writes += [ensureDeferred(store.record_usage(usage(f"c{i}"))) for i in range(200)]
    results = await DeferredList(writes, fireOnOneErrback=True, consumeErrors=True)
    assert all(r[1].applied for r in results[:200])
    # The first went at once, alone; the 399 behind it together (2,000 at most per group).
    assert store.group.groups - before == 2
    assert len(await store.list_leases()) == 200
    assert sum(r["requests"] for r in await store.usage_totals("route")) == 200


@pytest_twisted.ensureDeferred
async def test_a_condition_that_fails_in_a_group_spares_the_others(store):
    await store.write(new_lease("taken"))
    writes = [ensureDeferred(store.write(new_lease(fp))) for fp in ("x", "taken", "y")]
    x, taken, y = [r for _, r in await DeferredList(writes, consumeErrors=True)]
    assert x.applied and y.applied and not taken.applied
    assert taken.current is not None and taken.current.key.fp == "taken"
    assert sorted(lease.key.fp for lease in await store.list_leases()) == ["taken", "x", "y"]


@pytest_twisted.ensureDeferred
async def test_a_group_that_fails_writes_none_of_its_writes_and_tells_each(store):
    broken = Change(events=[LeaseEvent(None, "r", "f", "m", "", "a", "new")])  # at NOT NULL
    blocker = ensureDeferred(store.write(new_lease("first")))  # idle: goes at once, alone
    writes = [ensureDeferred(store.write(c)) for c in (new_lease("x"), broken)]
    writes.append(ensureDeferred(store.record_usage(usage("x"))))
    await blocker
    outcomes = await DeferredList(writes, consumeErrors=True)
    assert [ok for ok, _ in outcomes] == [False, False, False]
    assert all(f.check(StoreError) for _, f in outcomes)
    assert sorted(lease.key.fp for lease in await store.list_leases()) == ["first"]
    assert await store.usage_totals("route") == []


@pytest.fixture
def file_store_url(shared_url):
    return shared_url


def hold(pool) -> tuple[threading.Event, object]:
    """Occupy `pool`'s one connection thread until the event is set."""
    release = threading.Event()
    busy = deferToThreadPool(reactor, pool.threadpool, release.wait, 30)
    return release, busy


@pytest_twisted.ensureDeferred
async def test_reports_do_not_wait_behind_the_writer(file_store_url):
    store = await open_store(file_store_url)
    try:
        await store.record_usage(usage("a"))
        release, busy = hold(store._pool)  # a long write transaction, say
        try:
            totals = await store.usage_totals("route")  # answered meanwhile
            events = await store.list_events()
            assert totals[0]["requests"] == 1 and events == []
        finally:
            release.set()
            await busy
    finally:
        await store.close()


@pytest_twisted.ensureDeferred
async def test_lease_writes_do_not_wait_behind_a_report(file_store_url):
    store = await open_store(file_store_url)
    try:
        release, busy = hold(store._reader)  # a slow report over a month of usage, say
        try:
            written = await store.write(new_lease("c"))  # saved meanwhile
            assert written.applied
        finally:
            release.set()
            await busy
        assert [lease.key.fp for lease in await store.list_leases()] == ["c"]
    finally:
        await store.close()
