"""The chooser: peers, then lowest leases/parallel, then most free slots, then config order."""

import pytest
import pytest_twisted
from lease_fakes import FakeHosts, MemoryStore, make_chooser, run_now

from crossbar.chooser import Chooser, Late
from crossbar.lease import Key, Table


def chooser(
    load=None, parallel=None, free=None, peers=None, peer_route="convo", model="m"
) -> Chooser:
    load, parallel, free, peers = load or {}, parallel or {}, free or {}, peers or set()

    def peer_hosts(route: str, m: str) -> set[str]:
        return set(peers) if (route, m) == (peer_route, model) else set()

    return Chooser(
        load=lambda h, m: load.get(h, 0),
        parallel=lambda h, m: parallel.get(h, 1),
        free_slots=lambda h, m: free.get(h, 0),
        peer_hosts=peer_hosts,
    )


def test_no_candidates_means_no_host():
    assert chooser().choose([], "m") is None


def test_a_host_of_a_peer_route_wins_over_a_less_loaded_one():
    c = chooser(load={"a": 0, "b": 5}, peers={"b"})
    assert c.choose(["a", "b"], "m", route="convo") == "b"


def test_peers_count_only_for_the_route_and_model_asked():
    c = chooser(load={"a": 0, "b": 5}, peers={"b"})
    assert c.choose(["a", "b"], "m", route="other") == "a"
    assert c.choose(["a", "b"], "m") == "a"  # no route: no peers


def test_among_peers_the_next_levels_still_decide():
    c = chooser(load={"a": 3, "b": 1, "c": 0}, peers={"a", "b"})
    assert c.choose(["a", "b", "c"], "m", route="convo") == "b"


def test_lowest_leases_per_slot_wins():
    # a: 2 leases on 4 slots (0.5) beats b: 1 lease on 1 slot (1.0), whatever the order.
    c = chooser(load={"a": 2, "b": 1}, parallel={"a": 4, "b": 1})
    assert c.choose(["b", "a"], "m") == "a"


def test_equal_shares_fall_to_free_slots():
    # 1/3 and 2/6 are the same share; b has more free slots.
    c = chooser(load={"a": 1, "b": 2}, parallel={"a": 3, "b": 6}, free={"a": 1, "b": 4})
    assert c.choose(["a", "b"], "m") == "b"


def test_unknown_parallel_counts_as_one_slot():
    c = chooser(load={"a": 1, "b": 1}, parallel={"a": 0, "b": 2})
    assert c.choose(["a", "b"], "m") == "b"


def test_full_ties_go_to_config_order():
    c = chooser(load={"a": 1, "b": 1}, free={"a": 2, "b": 2})
    assert c.choose(["b", "a"], "m") == "b"
    assert c.choose(["a", "b"], "m") == "a"


def test_the_choice_is_deterministic():
    c = chooser(load={"a": 1, "b": 0, "c": 0}, free={"b": 1, "c": 1})
    assert {c.choose(["a", "b", "c"], "m") for _ in range(20)} == {"b"}


def test_late_holder_refuses_before_it_is_set():
    ref: Late[Table] = Late()
    with pytest.raises(RuntimeError, match="before set"):
        ref.get()


def test_a_chooser_built_before_the_table_reads_its_lease_counts():
    # The service's wiring: the chooser's callables close over a Late filled after load.
    ref: Late[Table] = Late()
    c = make_chooser(ref, peers={"review": ("convo",)})
    table = run_now(Table.load(MemoryStore(), FakeHosts(), c, 3600.0))
    ref.set(table)
    assert run_now(table.acquire(Key("convo", "f1", "m"), ["a", "b"], 1.0)).host == "a"
    assert run_now(table.acquire(Key("convo", "f2", "m"), ["a", "b"], 1.0)).host == "b"
    assert c.load("a", "m") == c.load("b", "m") == 1
    # review's peer convo holds leases on a and b; a is first in review's order.
    assert c.peer_hosts("review", "m") == {"a", "b"}
    assert run_now(table.acquire(Key("review", "g", "m"), ["c", "a"], 1.0)).host == "a"


@pytest_twisted.ensureDeferred
async def test_the_table_passes_its_route_to_the_chooser():
    seen = []

    class Spy:
        def choose(self, candidates, model, route=""):
            seen.append((list(candidates), model, route))
            return candidates[-1]

    table = await Table.load(MemoryStore(), FakeHosts(down={"a"}), Spy(), 3600.0)
    got = await table.acquire(Key("convo", "f", "m"), ["a", "b", "c"], 1.0)
    assert got.host == "c"
    assert seen == [(["b", "c"], "m", "convo")]
