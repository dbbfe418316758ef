"""Cache truth: a reused turn that lost its previous prompt is an eviction; what a host failed
to keep is its capacity; new conversations go where the active ones leave room."""

from twisted.internet.task import Clock

from crossbar.config.values import parse_config
from crossbar.leases.table import Key, Lease, State
from crossbar.leases.warmth import ACTIVE_WINDOW, Warmth
from crossbar.records import LeaseEvent

HOSTS = {
    "titan": {"url": "http://titan:8080", "models": ["m"]},
    "atlas": {"url": "http://atlas:8080", "models": ["m"], "cache_tokens": 5000},
}


def config(hosts=None):
    return parse_config({"hosts": hosts or HOSTS, "routes": {"r": {"hosts": ["titan", "atlas"]}}})


def lease(fp: str, host: str = "titan") -> Lease:
    return Lease(Key("r", fp, "m"), host, State.ACTIVE, 0.0, 0.0)


def test_a_turn_that_finds_its_previous_prompt_cached_is_kept():
    warmth = Warmth(config(), Clock())
    a = lease("a")
    assert not warmth.turn(a, prompt=1000, cached=0, completion=50)  # the first: nothing to lose
    assert not warmth.turn(a, prompt=1100, cached=1040, completion=50)
    assert warmth.status("titan")["kept_turns"] == 1
    assert (a.turn_prompt, a.turn_cached, a.cold) == (1100, 1040, False)


def test_a_turn_that_lost_its_previous_prompt_is_an_eviction_and_the_lease_turns_cold():
    warmth = Warmth(config(), Clock())
    a = lease("a")
    warmth.turn(a, prompt=1000, cached=0, completion=50)
    assert warmth.turn(a, prompt=1100, cached=330, completion=50)  # only a shared prefix left
    assert a.cold and warmth.status("titan")["evictions"] == 1


def test_a_few_tokens_short_is_the_template_not_an_eviction():
    warmth = Warmth(config(), Clock())
    a, small = lease("a"), lease("small")
    warmth.turn(a, prompt=1000, cached=0, completion=50)
    assert not warmth.turn(a, prompt=1100, cached=980, completion=50)  # 20 short of 1000
    warmth.turn(small, prompt=40, cached=0, completion=5)
    assert not warmth.turn(small, prompt=60, cached=10, completion=5)  # 30 lost: under MIN_LOST


def test_the_tokens_served_since_an_evicted_turn_are_learned_as_the_capacity():
    clock = Clock()
    warmth = Warmth(config(), clock)
    a, b, c = lease("a"), lease("b"), lease("c")
    warmth.turn(a, prompt=1000, cached=0, completion=100)  # a holds 1100
    warmth.turn(b, prompt=2000, cached=0, completion=100)  # then b 2100, c 1050
    warmth.turn(c, prompt=1000, cached=0, completion=50)
    assert warmth.status("titan")["warm_capacity"] is None
    warmth.turn(a, prompt=1200, cached=0, completion=100)  # evicted by b and c
    status = warmth.status("titan")
    assert (status["warm_capacity"], status["warm_capacity_source"]) == (4250, "learned")
    # A configured cache_tokens wins over anything learned.
    assert warmth.status("atlas")["warm_capacity"] == 5000


def test_room_is_what_the_active_conversations_leave_of_the_capacity():
    clock = Clock()
    warmth = Warmth(config(), clock)
    assert warmth.room("titan", 10**9)  # capacity unknown: neither preferred nor penalised
    a, b = lease("a", "atlas"), lease("b", "atlas")
    warmth.turn(a, prompt=2000, cached=0, completion=0)
    warmth.turn(b, prompt=2000, cached=0, completion=0)
    assert warmth.room("atlas", 1000) and not warmth.room("atlas", 1001)  # 5000 configured
    assert warmth.room("atlas", 3000, leaving=b)  # b's own tokens do not count against it
    clock.advance(ACTIVE_WINDOW + 1)
    assert warmth.room("atlas", 5000)  # idle conversations no longer hold a host


def test_a_lease_that_leaves_its_host_no_longer_counts_there():
    warmth = Warmth(config(), Clock())
    warmth.turn(lease("a", "atlas"), prompt=4000, cached=0, completion=0)
    assert not warmth.room("atlas", 2000)
    warmth.lease_event(LeaseEvent(1.0, "r", "a", "m", "atlas", "titan", "cold"))
    assert warmth.room("atlas", 2000)


def test_a_host_given_another_url_is_another_cache():
    warmth = Warmth(config(), Clock())
    a = lease("a")
    warmth.turn(a, prompt=1000, cached=0, completion=0)
    warmth.turn(a, prompt=1100, cached=0, completion=0)
    assert warmth.status("titan")["evictions"] == 1
    warmth.reconfigure(config(HOSTS))  # the same config: kept
    assert warmth.status("titan")["evictions"] == 1
    moved = {**HOSTS, "titan": {**HOSTS["titan"], "url": "http://titan2:8080"}}
    warmth.reconfigure(config(moved))
    assert warmth.status("titan")["evictions"] == 0


def test_another_prompt_of_the_same_session_is_not_an_eviction():
    # An agent's session id covers its title request and its conversation: the second
    # prompt never began with the first, so finding little of it cached says nothing.
    warmth = Warmth(config(), Clock())
    a = lease("a")
    warmth.turn(a, prompt=600, cached=0, completion=10, opening="title")
    assert not warmth.turn(a, prompt=2200, cached=40, completion=50, opening="conversation")
    assert warmth.status("titan")["evictions"] == 0 and not a.cold
    # From there on the conversation is the baseline: losing it is an eviction.
    assert warmth.turn(a, prompt=2400, cached=40, completion=50, opening="conversation")


def test_a_conversation_that_cut_its_history_is_not_an_eviction():
    warmth = Warmth(config(), Clock())
    a = lease("a")
    warmth.turn(a, prompt=9000, cached=0, completion=50, opening="o")
    assert not warmth.turn(a, prompt=3000, cached=800, completion=50, opening="o")  # compacted
    assert warmth.status("titan")["evictions"] == 0


def test_what_a_newcomer_finds_is_learned_from_first_turns_after_the_host_was_primed():
    from crossbar.leases.warmth import HostWarmth

    host = HostWarmth()
    host.first_turn("convo", "m", 0)  # the route's first conversation here: a cold host
    assert host.fresh[("convo", "m")] is None
    host.first_turn("convo", "m", 330)  # the next finds the shared system prompt
    assert host.fresh[("convo", "m")] == 330
    host.first_turn("convo", "m", 0)  # one with another system prompt finds nothing
    assert host.fresh[("convo", "m")] == 165
    other = HostWarmth()
    other.first_turn("convo", "m", 0)
    other.first_turn("convo", "m", 0)  # found nothing twice: nothing is shared here
    assert other.fresh[("convo", "m")] == 0
