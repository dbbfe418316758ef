"""The sweep expires idle leases in bounded batches: at most `sweep_batch` per transaction, with
the reactor free between them, and a lease used meanwhile is spared."""

from __future__ import annotations

from attrs import define, field
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from crossbar.leases.chooser import Chooser
from crossbar.leases.expiry import SCAN_SLICE
from crossbar.leases.journal import Journal
from crossbar.leases.table import Key, Lease, State, Table
from crossbar.leases.types import Change, Written
from tests.support.lease_fakes import FakeCapacity, FakeHosts, MemoryStore, run_now


@define
class CountingStore(MemoryStore):
    """A MemoryStore that counts the leases each write deletes."""

    batches: list[int] = field(factory=list)

    async def write(self, change: Change, durable: bool = False) -> Written:
        self.batches.append(len(change.delete))
        return await MemoryStore.write(self, change, durable)


@define
class GatedStore(CountingStore):
    """Its writes wait for the test to let each one through."""

    gates: list[Deferred[None]] = field(factory=list)

    async def write(self, change: Change, durable: bool = False) -> Written:
        gate: Deferred[None] = Deferred()
        self.gates.append(gate)
        await gate
        return await CountingStore.write(self, change, durable)


def leases(n: int, last_used: float = 0.0) -> dict[Key, Lease]:
    keys = [Key("r", f"fp{i}", "m") for i in range(n)]
    return {k: Lease(k, "a", State.ACTIVE, 0.0, last_used) for k in keys}


def table_on(store: MemoryStore, clock: Clock) -> Table:
    chooser = Chooser(FakeCapacity())
    return run_now(Table.load(store, FakeHosts(), chooser, 100.0, Journal(store, clock)))


def test_expiry_writes_at_most_one_batch_per_transaction():
    store = CountingStore(rows=leases(2_500))
    table = table_on(store, Clock())
    assert run_now(table.expire_idle(1_000.0, batch=1_000)) == 2_500
    assert store.batches == [1_000, 1_000, 500]
    assert len(table) == 0 and store.rows == {}
    assert [e.reason for e in store.events] == ["idle"] * 2_500


def test_a_lease_used_while_an_earlier_batch_is_written_is_spared():
    store = GatedStore(rows=leases(3))
    clock = Clock()
    table = table_on(store, clock)
    done: list[int] = []
    Deferred.fromCoroutine(table.expire_idle(1_000.0, batch=1)).addCallback(done.append)
    assert len(store.gates) == 1  # the first batch is being written
    last = Key("r", "fp2", "m")
    got = Deferred.fromCoroutine(table.acquire(last, ["a"], 999.0))  # a request, meanwhile
    while any(not gate.called for gate in store.gates):  # each write lands, in order
        next(gate for gate in store.gates if not gate.called).callback(None)
    assert done == [2] and got.result.host == "a"
    assert [k.fp for k in (x.key for x in table.snapshot())] == ["fp2"]


def test_a_large_table_is_scanned_in_slices_with_the_reactor_free_between():
    clock = Clock()
    store = MemoryStore(rows=leases(SCAN_SLICE * 2 + 5))
    table = table_on(store, clock)
    done: list[int] = []
    Deferred.fromCoroutine(table.expire_idle(1_000.0, batch=50_000)).addCallback(done.append)
    assert done == []  # paused after the first slice: the reactor runs other calls meanwhile
    clock.advance(0)  # (the clock runs the next pause's call too: it is due at once)
    assert done == [SCAN_SLICE * 2 + 5]


def test_the_sweep_takes_its_batch_from_the_config():
    from crossbar.app.sweep import Sweep
    from crossbar.config.values import parse_config

    store = CountingStore(rows=leases(30))
    clock = Clock()
    clock.advance(1_000)
    table = table_on(store, clock)
    a = {"url": "http://a:8080", "models": ["m"]}
    config = parse_config({"server": {"sweep_batch": 7}, "hosts": {"a": a}})
    assert run_now(Sweep(config, table, store, clock).run()) == (30, 0, 0)
    assert store.batches == [7, 7, 7, 7, 2]


def test_the_new_keys_are_checked_with_their_dotted_paths():
    import pytest

    from crossbar.config.values import ConfigError, parse_config

    a = {"url": "http://a:8080", "models": ["m"]}
    bad = {"sweep_batch": 0, "flap_window": "soon", "flap_holddown_max": 5}
    with pytest.raises(ConfigError) as caught:
        parse_config({"server": bad, "hosts": {"a": a}})
    paths = sorted(line.split(":")[0] for line in caught.value.errors)
    assert paths == ["server.flap_holddown_max", "server.flap_window", "server.sweep_batch"]
    good = parse_config({"server": {"flap_holddown": "0s"}, "hosts": {"a": a}}).server
    assert good.flap_holddown == 0 and good.sweep_batch == 200  # "0s": no damping
