"""A store that takes a write and never answers is treated as one that failed, at the
journal's deadline: clients are served from memory, the operator is refused, and a refused
change the store takes after all still reaches memory."""

from twisted.internet.defer import ensureDeferred
from twisted.internet.task import Clock

from crossbar.leases import Chooser, Journal, Key, Table
from tests.support.lease_fakes import FakeCapacity, FakeHosts, HeldStore, MemoryStore, run_now

K = Key("convo", "f1", "m")


def table_on(store: HeldStore, clock: Clock) -> Table:
    journal = Journal(store, clock, deadline=6.0)
    return run_now(Table.load(store, FakeHosts(), Chooser(FakeCapacity()), 3600.0, journal))


def test_a_write_not_answered_by_the_deadline_is_kept_and_the_client_served():
    clock, store = Clock(), HeldStore(MemoryStore())
    table = table_on(store, clock)
    got = ensureDeferred(table.acquire(K, ["a", "b"], 1.0))
    assert not got.called and len(store.held) == 1  # the store took it and says nothing
    clock.advance(5.9)
    assert not got.called and not table.journal.degraded
    clock.advance(0.1)
    assert got.result.host == "a"  # served from memory
    assert table.journal.degraded and "not answered a write for 6s" in table.journal.reason
    assert table.journal.unsaved(K) and table.lease(K) is not None
    # Once degraded, the next change does not wait at all.
    other = ensureDeferred(table.acquire(Key("convo", "f2", "m"), ["a", "b"], 1.0))
    assert other.called


def test_an_operator_change_not_answered_by_the_deadline_is_refused_then_followed_if_taken():
    clock, store = Clock(), HeldStore(MemoryStore())
    table = table_on(store, clock)
    table.note_candidates("convo", ["a", "b"])
    pin = ensureDeferred(table.pin("convo", "b", 1.0))
    clock.advance(6.0)
    failure = pin.result
    pin.addErrback(lambda _: None)
    assert "cannot be written" in str(failure.value) and table.pinned("convo") is None
    store.let_go()  # the store took the pin after all: memory follows the store
    assert table.pinned("convo") == "b"
    assert store.inner.rows[Key("convo", "", "")].host == "b"
