"""The chooser: not held down, then what running the model takes (router mode), then room to
stay warm, then peers, then lowest leases/parallel (placements under
way counted), then what each host is doing now, then most free slots, then config order. A
batch request, with no conversation to keep warm, goes by its room under the batch cap."""

import pytest_twisted

from crossbar.leases.chooser import (
    EVICTS,
    FREE_PLACE,
    KEPT,
    LOADED,
    NEVER,
    SPARE,
    Chooser,
    HostView,
    pick,
)
from crossbar.leases.table import Key, Lease, State, Table
from tests.support.lease_fakes import FakeCapacity, FakeHosts, MemoryStore, run_now


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


def test_a_parallel_below_one_counts_as_one_slot_in_the_ranking():
    assert pick(views(load={"a": 1, "b": 1}, parallel={"a": 0, "b": 2})) == "b"


def test_equal_shares_fall_to_what_each_host_is_doing_now():
    # Same leases per slot: the host with fewer requests in flight and queued wins, before
    # free slots and config order are asked.
    v = [HostView("a", False, 1, 2, 2, busy=3), HostView("b", False, 1, 2, 0, busy=1)]
    assert pick(v) == "b"


def test_a_host_with_room_to_keep_the_conversation_warm_comes_first():
    full = HostView("a", True, 0, 4, 4, room=False)  # a peer, no leases, all slots free
    roomy = HostView("b", False, 9, 4, 0)
    assert pick([full, roomy]) == "b"
    held = HostView("c", False, 0, 4, 4, held=True)
    assert pick([held, full]) == "a"  # held after flapping still weighs first


def test_a_host_whose_slots_are_not_known_yet_is_weighed_as_a_typical_one():
    # b has not been read yet: its "1 slot" is no fact, so it is weighed as the known
    # candidates' mean (4), neither preferred nor penalised.
    capacity = FakeCapacity(parallel_of={"a": 4, "b": 1, "c": 4}, free={"a": 4, "c": 4})
    c = Chooser(capacity, known=lambda host, model: host != "b")
    leases = {"a": 2, "b": 1, "c": 2}.get
    assert c.choose(["a", "b", "c"], "m", leases=leases) == "b"  # 1/4 beats 2/4
    leases = {"a": 1, "b": 1, "c": 1}.get
    assert c.choose(["b", "a", "c"], "m", leases=leases) == "b"  # equal: free slots, order
    # Taken at its word, the one slot would have made b look full.
    assert Chooser(capacity).choose(["b", "a", "c"], "m", leases=leases) == "a"


def test_the_chooser_reads_what_each_host_is_doing_from_its_capacity():
    capacity = FakeCapacity(
        parallel_of={"a": 2, "b": 2}, free={"a": 1, "b": 1}, running={"a": 1, "b": 1}
    )
    capacity.waiting["a"] = 2
    assert Chooser(capacity).choose(["a", "b"], "m") == "b"


def test_a_lease_placed_again_does_not_count_on_the_host_it_leaves():
    capacity = FakeCapacity(parallel_of={"a": 1, "b": 1})
    moving = Lease(Key("r", "f", "m"), "a", State.ACTIVE, 0.0, 0.0)
    leases = {"a": 1, "b": 1}.get
    assert Chooser(capacity).choose(["b", "a"], "m", leases=leases) == "b"
    assert Chooser(capacity).choose(["b", "a"], "m", leases=leases, leaving=moving) == "a"


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
        def choose(self, candidates, model, leases, peers, need, leaving, batch=None, home=None):
            seen.append((list(candidates), model, [leases(h) for h in candidates], set(peers)))
            return candidates[-1]

    table = await Table.load(MemoryStore(), FakeHosts(down={"a"}), Spy(), 3600.0)
    got = await table.acquire(Key("convo", "f", "m"), ["a", "b", "c"], 1.0)
    assert got.host == "c"
    assert seen == [(["b", "c"], "m", [0, 0], set())]


def test_a_host_with_the_model_loaded_goes_before_any_that_would_load_it():
    # b has the model loaded but holds more leases and no free slot; a would have to load it.
    loads = HostView("a", True, 0, 4, 4, tier=FREE_PLACE)
    loaded = HostView("b", False, 9, 4, 0, busy=8, tier=LOADED)
    assert pick([loads, loaded]) == "b"


def test_a_free_place_goes_before_an_unload_and_a_spare_unload_before_an_active_ones():
    assert pick([HostView("a", False, 0, 1, 1, tier=SPARE),
                 HostView("b", False, 5, 1, 0, tier=FREE_PLACE)]) == "b"  # fmt: skip
    assert pick([HostView("a", False, 0, 1, 1, tier=EVICTS),
                 HostView("b", False, 5, 1, 0, tier=SPARE)]) == "b"  # fmt: skip


def test_a_host_that_keeps_the_model_comes_first_and_one_it_cannot_run_on_last():
    v = [HostView("a", False, 0, 1, 1, tier=LOADED), HostView("b", False, 3, 1, 0, tier=KEPT)]
    assert pick(v) == "b"
    v = [HostView("a", False, 0, 1, 1, tier=NEVER), HostView("b", False, 3, 1, 0, tier=EVICTS)]
    assert pick(v) == "b"


def test_a_flapping_host_stays_last_whatever_it_has_loaded():
    v = [HostView("a", False, 0, 1, 1, held=True, tier=KEPT),
         HostView("b", False, 0, 1, 1, tier=EVICTS)]  # fmt: skip
    assert pick(v) == "b"


def test_the_chooser_asks_each_candidate_what_running_the_model_takes():
    class Tiers:
        def tier(self, host: str, model: str) -> int:
            return {"a": FREE_PLACE, "b": LOADED}[host]

        def crowd(self, host: str) -> int:
            return 1

        def evicts(self, host: str, model: str) -> int:
            return 0

    chooser = Chooser(FakeCapacity(), loads=Tiers())
    assert chooser.choose(["a", "b"], "m", leases=lambda h: {"a": 0, "b": 7}[h]) == "b"


def test_of_the_hosts_with_a_free_place_the_one_running_fewest_models_loads_it():
    v = [HostView("a", False, 0, 1, 1, tier=FREE_PLACE, crowd=1),
         HostView("b", False, 3, 1, 0, tier=FREE_PLACE, crowd=0)]  # fmt: skip
    assert pick(v) == "b"
    # Where the model is loaded, how many others run there does not decide.
    v = [HostView("a", False, 0, 1, 1, tier=LOADED, crowd=2),
         HostView("b", False, 3, 1, 0, tier=LOADED, crowd=1)]  # fmt: skip
    assert pick(v) == "a"


def test_where_the_model_must_unload_another_it_goes_where_its_conversations_are():
    # Loaded nowhere: the host holding most of its leases loads it, so its turns batch there.
    v = [HostView("a", False, 1, 2, 2, tier=EVICTS), HostView("b", False, 3, 2, 0, tier=EVICTS)]
    assert pick(v) == "b"


def test_where_every_host_must_unload_a_model_the_least_wanted_one_goes():
    # A cold model never unseats a hot one: the unload that costs fewest conversations wins.
    v = [HostView("a", False, 0, 2, 2, tier=EVICTS, evicts=4),
         HostView("b", False, 0, 2, 2, tier=EVICTS, evicts=1)]  # fmt: skip
    assert pick(v) == "b"


def batch(name: str, room: int, leases: int = 0, **kw) -> HostView:
    return HostView(name, False, leases, 2, 0, batch_room=room, **kw)


def test_a_batch_request_goes_where_its_cap_has_room_not_where_leases_are_fewest():
    assert pick([batch("a", 0, leases=0), batch("b", 2, leases=9)]) == "b"


def test_a_batch_request_keeps_to_its_system_prompts_home_while_it_can_start_there():
    assert pick([batch("a", 2), batch("b", 1, home=True)]) == "b"
    assert pick([batch("a", 1), batch("b", 0, home=True)]) == "a"  # home is full: start now


def test_where_no_host_can_start_it_the_shortest_batch_queue_wins_then_home():
    assert pick([batch("a", -3, home=True), batch("b", -1)]) == "b"
    assert pick([batch("a", -1), batch("b", -1, home=True)]) == "b"


def test_a_batch_request_never_takes_a_worse_tier_or_a_held_host_for_room():
    assert pick([batch("a", 5, tier=EVICTS), batch("b", -2, tier=LOADED)]) == "b"
    assert pick([batch("a", 5, held=True), batch("b", -2)]) == "b"


def test_the_chooser_asks_the_capacity_for_batch_room_only_for_a_batch_request():
    capacity = FakeCapacity(parallel_of={"a": 2, "b": 2}, free={"a": 0, "b": 2})
    chooser = Chooser(capacity)
    crowded = {"a": 0, "b": 5}
    assert chooser.choose(["a", "b"], "m", leases=crowded.get, batch="bulk") == "b"
    assert chooser.choose(["a", "b"], "m", leases=crowded.get) == "a"
