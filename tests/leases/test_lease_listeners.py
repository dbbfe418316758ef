"""Listeners hear every lease event once it takes effect (written, or kept in memory while the
store fails), and never one that was refused."""

import pytest

from crossbar.leases.journal import StoreUnavailable
from crossbar.leases.table import Key
from tests.support.lease_fakes import FakeHosts, MemoryStore, make_table, run_now

AB = ["a", "b"]


def test_listeners_hear_new_pin_and_release_events_in_order():
    table = run_now(make_table(MemoryStore()))
    heard = []
    table.listeners.append(heard.append)
    run_now(table.acquire(Key("convo", "f1", "m"), AB, 1.0))
    run_now(table.acquire(Key("convo", "f2", "m"), AB, 1.0))
    run_now(table.pin("convo", "b", 2.0))
    run_now(table.release("convo", 3.0))
    assert [(e.reason, e.fp, e.from_host, e.to_host) for e in heard] == [
        ("new", "f1", "", "a"),
        ("new", "f2", "", "b"),
        ("pin", "", "", "b"),
        ("pin", "f1", "a", "b"),  # f1's lease on a is gone; its next request lands on b
        ("release", "f2", "b", ""),
    ]


def test_a_refused_change_tells_the_listeners_nothing_and_a_kept_one_tells_them():
    store = MemoryStore()
    table = run_now(make_table(store))
    table.note_candidates("convo", AB)
    heard = []
    table.listeners.append(heard.append)
    store.fail = True
    with pytest.raises(StoreUnavailable):
        run_now(table.pin("convo", "a", 1.0))
    assert heard == []
    # A lease made while the store fails takes effect (requests go there): it is heard.
    run_now(table.acquire(Key("convo", "f1", "m"), AB, 1.0))
    assert [(e.reason, e.fp) for e in heard] == [("new", "f1")]


def test_a_listener_that_raises_does_not_break_the_table_or_the_next_listener():
    table = run_now(make_table(MemoryStore(), FakeHosts()))
    heard = []

    def broken(event):
        raise RuntimeError("metrics bug")

    table.listeners.extend([broken, heard.append])
    acquired = run_now(table.acquire(Key("convo", "f1", "m"), AB, 1.0))
    assert acquired.host == "a" and len(heard) == 1
    assert table.snapshot()[0].host == "a"
