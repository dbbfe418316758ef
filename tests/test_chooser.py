"""The chooser: peers, then lowest leases/parallel, then most free slots, then config order."""

import pytest_twisted
from lease_fakes import FakeCapacity, FakeHosts, MemoryStore, run_now

from crossbar.chooser import Chooser, HostView, pick
from crossbar.lease import Key, Table


def views(load=None, parallel=None, free=None, peers=(), order=("a", "b")) -> list[HostView]:
    load, parallel, free = load or {}, parallel or {}, free or {}
    return [
        HostView(h, h in peers, load.get(h, 0), parallel.get(h, 1), free.get(h, 0)) for h in order
    ]


def test_no_candidates_means_no_host():
    assert pick([]) is None
    assert Chooser(FakeCapacity()).choose([], "m") is None


def test_a_host_of_a_peer_route_wins_over_a_less_loaded_one():
    assert pick(views(load={"a": 0, "b": 5}, peers={"b"})) == "b"


def test_without_peers_the_load_decides():
    assert pick(views(load={"a": 0, "b": 5})) == "a"


def test_among_peers_the_next_levels_still_decide():
    order = ("a", "b", "c")
    assert pick(views(load={"a": 3, "b": 1, "c": 0}, peers={"a", "b"}, order=order)) == "b"


def test_lowest_leases_per_slot_wins():
    # a: 2 leases on 4 slots (0.5) beats b: 1 lease on 1 slot (1.0), whatever the order.
    assert pick(views(load={"a": 2, "b": 1}, parallel={"a": 4, "b": 1}, order=("b", "a"))) == "a"


def test_equal_shares_fall_to_free_slots():
    # 1/3 and 2/6 are the same share; b has more free slots.
    got = pick(views(load={"a": 1, "b": 2}, parallel={"a": 3, "b": 6}, free={"a": 1, "b": 4}))
    assert got == "b"


def test_unknown_parallel_counts_as_one_slot():
    assert pick(views(load={"a": 1, "b": 1}, parallel={"a": 0, "b": 2})) == "b"


def test_full_ties_go_to_config_order():
    assert pick(views(load={"a": 1, "b": 1}, free={"a": 2, "b": 2}, order=("b", "a"))) == "b"
    assert pick(views(load={"a": 1, "b": 1}, free={"a": 2, "b": 2}, order=("a", "b"))) == "a"


def test_the_choice_is_deterministic():
    v = views(load={"a": 1, "b": 0, "c": 0}, free={"b": 1, "c": 1}, order=("a", "b", "c"))
    assert {pick(v) for _ in range(20)} == {"b"}


def test_the_chooser_reads_slots_from_its_capacity_and_leases_from_its_caller():
    c = Chooser(FakeCapacity(parallel_of={"a": 4, "b": 1}, free={"b": 1}))
    # a: 2 leases on 4 slots beats b: 1 on 1 slot; the counts are the caller's.
    assert c.choose(["b", "a"], "m", leases={"a": 2, "b": 1}.get) == "a"
    assert c.choose(["b", "a"], "m", leases={"a": 2, "b": 1}.get, peers={"b"}) == "b"


def test_the_table_gives_the_chooser_its_lease_counts_and_the_routes_peer_hosts():
    table = run_now(Table.load(MemoryStore(), FakeHosts(), Chooser(FakeCapacity()), 3600.0))
    assert run_now(table.acquire(Key("convo", "f1", "m"), ["a", "b"], 1.0)).host == "a"
    assert run_now(table.acquire(Key("convo", "f2", "m"), ["a", "b"], 1.0)).host == "b"
    assert table.count("a", "m") == table.count("b", "m") == 1
    # review's peer convo holds leases on a and b; a is first in review's order.
    got = run_now(table.acquire(Key("review", "g", "m"), ["c", "a"], 1.0, peers=("convo",)))
    assert got.host == "a"
    # Without the peer rule c (no lease at all) would have won.
    assert run_now(table.acquire(Key("other", "g", "m"), ["c", "a"], 1.0)).host == "c"


@pytest_twisted.ensureDeferred
async def test_the_table_offers_only_usable_candidates_with_their_counts():
    seen = []

    class Spy:
        def choose(self, candidates, model, leases, peers):
            seen.append((list(candidates), model, [leases(h) for h in candidates], set(peers)))
            return candidates[-1]

    table = await Table.load(MemoryStore(), FakeHosts(down={"a"}), Spy(), 3600.0)
    got = await table.acquire(Key("convo", "f", "m"), ["a", "b", "c"], 1.0)
    assert got.host == "c"
    assert seen == [(["b", "c"], "m", [0, 0], set())]
