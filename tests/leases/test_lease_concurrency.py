"""Concurrent acquires of one key resolve to one host; other keys never wait behind them."""

import pytest
import pytest_twisted
from twisted.internet.defer import CancelledError, DeferredList, ensureDeferred

from crossbar.leases.table import Acquired, Key
from tests.support.lease_fakes import HeldStore, hosts_of, make_table, story

K = Key("convo", "f1", "m")
AB = ["a", "b"]


@pytest_twisted.ensureDeferred
async def test_fifty_concurrent_acquires_of_a_new_key_make_one_lease_on_one_host(store):
    # The first call's write is held, so the other 49 really are waiting while it is in flight.
    # Once it lands, a holds a lease, so the chooser would pick b for a second lease of K.
    held = HeldStore(store, hold=lambda save, delete, events: any(x.key == K for x in save))
    table = await make_table(held)
    calls = [ensureDeferred(table.acquire(K, AB, 1.0)) for _ in range(50)]
    assert len(held.held) == 1 and not any(c.called for c in calls)
    assert table.placing("a", "m") == 1  # K's lease counts for a while it is being written

    # Another key goes straight through while K's write is still held, to the other host.
    other = await table.acquire(Key("convo", "f2", "m"), AB, 1.0)
    assert other == Acquired("b", reused=False, pinned=False)
    assert len(held.held) == 1 and not any(c.called for c in calls)

    held.let_go()
    results = [r for ok, r in await DeferredList(calls, consumeErrors=True) if ok]
    assert results[0] == Acquired("a", reused=False, pinned=False)
    assert results[1:] == [Acquired("a", reused=True, pinned=False)] * 49
    assert hosts_of(table) == {("convo", "f1", "m"): "a", ("convo", "f2", "m"): "b"}
    assert table.placing("a", "m") == 0
    assert [e for e in await story(store) if e[2] == "f1"] == [("new", "convo", "f1", "", "a")]
    assert len(table._locks) == 0  # every per-key lock is dropped once free


@pytest_twisted.ensureDeferred
async def test_calls_for_one_key_are_served_one_at_a_time_in_arrival_order(store):
    held = HeldStore(store)
    table = await make_table(held, idle=0.0)  # idle 0: every reuse saves last_used
    calls = [ensureDeferred(table.acquire(K, AB, float(t))) for t in range(1, 6)]
    for i, call in enumerate(calls):
        # Only the call holding K's lock is writing; the ones after it have not started.
        assert len(held.held) == 1 and not any(c.called for c in calls[i:])
        held.let_go()
        assert (await call).reused == (i > 0)
        assert table.snapshot()[0].last_used == float(i + 1)


@pytest_twisted.ensureDeferred
async def test_a_caller_cancelled_while_waiting_for_the_key_leaves_the_queue(store):
    held = HeldStore(store)
    table = await make_table(held)
    first = ensureDeferred(table.acquire(K, AB, 1.0))
    waiting = ensureDeferred(table.acquire(K, AB, 1.0))
    waiting.cancel()
    with pytest.raises(CancelledError):
        await waiting
    held.let_go()
    assert (await first).host == "a"
    assert len(table._locks) == 0
