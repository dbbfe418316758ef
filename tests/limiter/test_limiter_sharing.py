"""How routes share the limiter's slots, one story each, on a fake clock: priorities, weights,
per-route caps and queue bounds, and reloads that change them under waiters already queued."""

from __future__ import annotations

from collections import Counter

from twisted.internet.task import Clock

from crossbar.config.limits import RouteLimits
from crossbar.config.values import parse_config
from crossbar.limiter.slots import Limiter, QueueFull, RouteQueueFull
from tests.limiter.test_limiter import Outcome

H, A, M = "titan", "atlas", "qwen"


class Fixture:
    def __init__(self, parallel: int = 1, queue_max: int = 1000, queue_timeout: float = 600.0):
        self.clock = Clock()
        self.parallel = {(H, M): parallel, (A, M): parallel}
        self.limiter = Limiter(
            self.clock, lambda h, m: self.parallel.get((h, m), 1), queue_max, queue_timeout
        )

    def acquire(self, route: RouteLimits | None, host: str = H) -> Outcome:
        return Outcome(self.limiter.acquire(host, M, route))

    def in_flight(self, route: RouteLimits) -> int:
        state = self.limiter.route(route.name)
        return 0 if state is None else state.in_flight


def config_with(**routes: dict) -> object:
    hosts = {H: {"url": "http://h:1", "models": [M]}, A: {"url": "http://a:1", "models": [M]}}
    return parse_config(
        {
            "server": {"queue_max": 1000, "queue_timeout": "10m"},
            "hosts": hosts,
            "routes": {name: {"hosts": [H, A], **keys} for name, keys in routes.items()},
        }
    )


def test_two_backlogged_routes_with_weights_3_and_1_are_admitted_3_to_1():
    f = Fixture(parallel=2)
    heavy, light = RouteLimits("heavy", weight=3), RouteLimits("light", weight=1)
    holders = [f.acquire(heavy), f.acquire(light)]
    admitted: Counter[str] = Counter()
    backlog = {"heavy": [f.acquire(heavy) for _ in range(10)]}
    backlog["light"] = [f.acquire(light) for _ in range(10)]
    for _ in range(400):
        f.clock.advance(1)
        done = holders.pop(0)
        assert done.release
        done.release()  # its slot goes to the next waiter in fair order
        for name, waiting in backlog.items():
            for w in [w for w in waiting if w.release]:
                waiting.remove(w)
                holders.append(w)
                admitted[name] += 1
                # Both routes stay backlogged: each admission is replaced by a new waiter.
                waiting.append(f.acquire(heavy if name == "heavy" else light))
    assert sum(admitted.values()) == 400
    assert abs(admitted["heavy"] / admitted["light"] - 3) <= 0.3, admitted


def test_a_higher_priority_arrival_is_admitted_before_every_waiting_lower_priority_one():
    f = Fixture(parallel=1)
    batch, agent = RouteLimits("batch"), RouteLimits("agent", priority=1)
    holder = f.acquire(batch)
    backlog = [f.acquire(batch) for _ in range(5)]
    urgent = f.acquire(agent)
    assert urgent.waiting
    assert holder.release
    holder.release()
    assert urgent.release and all(w.waiting for w in backlog)
    urgent.release()
    assert [w.waiting for w in backlog] == [False, True, True, True, True]


def test_a_lower_priority_waits_behind_every_higher_one_even_if_it_came_first():
    f = Fixture(parallel=1)
    low, mid, high = (RouteLimits(n, priority=p) for n, p in (("low", -5), ("mid", 0), ("hi", 5)))
    holder = f.acquire(mid)
    order = [f.acquire(low), f.acquire(mid), f.acquire(high), f.acquire(low), f.acquire(high)]
    admitted = []
    assert holder.release
    current = holder
    for _ in order:
        current.release()
        (current,) = [w for w in order if w.release and w not in admitted]
        admitted.append(current)
    assert admitted == [order[2], order[4], order[1], order[0], order[3]]


def test_a_route_at_max_in_flight_never_exceeds_it_while_another_routes_waiter_takes_its_place():
    f = Fixture(parallel=2)
    batch, agent = RouteLimits("batch", max_in_flight=1), RouteLimits("agent")
    batch_holder, agent_holder = f.acquire(batch), f.acquire(agent)
    batch_waiters = [f.acquire(batch) for _ in range(3)]  # first in line, but at the cap
    behind = f.acquire(agent)
    assert behind.waiting and f.in_flight(batch) == 1
    assert agent_holder.release
    agent_holder.release()  # a free slot: batch is at its cap, so the agent behind it goes
    assert behind.release
    assert f.in_flight(batch) == 1 and all(w.waiting for w in batch_waiters)
    behind.release()  # a free slot again, and still only the capped route waits
    assert f.limiter.free_slots(H, M) == 1
    assert f.in_flight(batch) == 1 and all(w.waiting for w in batch_waiters)
    assert batch_holder.release
    batch_holder.release()  # below its cap: its first waiter gets a slot, and only one
    assert [w.waiting for w in batch_waiters] == [False, True, True]
    assert f.in_flight(batch) == 1


def test_a_cap_counts_the_route_over_every_host():
    f = Fixture(parallel=4)
    batch = RouteLimits("batch", max_in_flight=2)
    on_titan = f.acquire(batch, H)
    on_atlas = f.acquire(batch, A)
    third = f.acquire(batch, A)
    assert on_titan.release and on_atlas.release and third.waiting
    assert f.limiter.free_slots(A, M) == 3  # a free slot, and the route still waits: its cap


def test_a_capped_route_freeing_a_slot_lets_its_waiters_into_free_slots_on_other_hosts():
    f = Fixture(parallel=1)
    batch = RouteLimits("batch", max_in_flight=1)
    on_titan = f.acquire(batch, H)
    on_atlas = f.acquire(batch, A)  # atlas is free; the cap holds it back
    assert on_atlas.waiting and f.limiter.free_slots(A, M) == 1
    other = f.acquire(RouteLimits("other"), H)  # waits for titan's slot
    assert on_titan.release
    on_titan.release()
    assert other.release  # titan's slot went to the first eligible waiter there...
    assert on_atlas.release  # ...and the freed cap let batch into atlas's free slot
    assert f.in_flight(batch) == 1


def test_tracked_requests_count_in_the_routes_in_flight():
    f = Fixture(parallel=2)
    ide = RouteLimits("ide")
    release = f.limiter.track(H, M, ide)
    state = f.limiter.route("ide")
    assert state is not None and (state.in_flight, state.tracked) == (1, 1)
    release()
    assert f.limiter.route("ide") is None  # an idle route is forgotten


def test_max_queued_bounds_a_routes_waiters_per_host_and_model():
    f = Fixture(parallel=1, queue_max=10)
    batch = RouteLimits("batch", max_queued=2)
    f.acquire(batch)
    f.acquire(batch), f.acquire(batch)
    refused = f.acquire(batch)
    assert isinstance(refused.error, RouteQueueFull)
    assert (refused.error.route, refused.error.bound) == ("batch", 2)
    assert refused.error.retry_after >= 1
    assert f.acquire(batch, A).release  # another (host, model) has a bound of its own
    assert f.acquire(RouteLimits("agent")).waiting  # other routes still queue
    assert f.limiter.queued_by_route(H, M) == {"agent": 1, "batch": 2}


def test_queue_max_still_bounds_the_whole_queue():
    f = Fixture(parallel=1, queue_max=2)
    f.acquire(RouteLimits("a"))
    f.acquire(RouteLimits("a")), f.acquire(RouteLimits("b", max_queued=50))
    refused = f.acquire(RouteLimits("b", max_queued=50))
    assert isinstance(refused.error, QueueFull)
    assert not isinstance(refused.error, RouteQueueFull)


def test_a_reload_applies_new_priorities_to_waiters_already_queued():
    f = Fixture(parallel=1)
    f.limiter.reconfigure(config_with(batch={}, agent={}))
    holder = f.acquire(RouteLimits("batch"))
    batch = f.acquire(RouteLimits("batch"))
    agent = f.acquire(RouteLimits("agent"))
    f.limiter.reconfigure(config_with(batch={}, agent={"priority": 1}))
    assert holder.release
    holder.release()
    assert agent.release and batch.waiting


def test_a_reload_applies_new_weights_to_waiters_already_queued():
    f = Fixture(parallel=1)
    f.limiter.reconfigure(config_with(a={}, b={}))
    holder = f.acquire(RouteLimits("a"))
    waiting = [f.acquire(RouteLimits("a")) for _ in range(8)]
    waiting += [f.acquire(RouteLimits("b")) for _ in range(8)]
    f.limiter.reconfigure(config_with(a={"weight": 1}, b={"weight": 3}))
    order = []
    current = holder
    for _ in range(8):
        assert current.release
        current.release()
        (current,) = [w for w in waiting if w.release and w not in order]
        order.append(current)
    routes = ["a" if waiting.index(w) < 8 else "b" for w in order]
    assert Counter(routes) == {"a": 2, "b": 6}


def test_a_reload_that_raises_a_cap_admits_at_once_into_free_slots():
    f = Fixture(parallel=3)
    f.limiter.reconfigure(config_with(batch={"max_in_flight": 1}))
    f.acquire(RouteLimits("batch"))
    waiters = [f.acquire(RouteLimits("batch")) for _ in range(3)]
    assert all(w.waiting for w in waiters)
    f.limiter.reconfigure(config_with(batch={"max_in_flight": 2}))
    assert [w.waiting for w in waiters] == [False, True, True]


def test_the_configs_limits_win_over_what_a_request_understood_before_a_reload_carries():
    f = Fixture(parallel=1)
    f.limiter.reconfigure(config_with(batch={"max_in_flight": 1}))
    stale = RouteLimits("batch", max_in_flight=5)  # what the request read before the reload
    f.acquire(stale)
    assert f.acquire(stale).waiting
    assert f.limiter.route("batch").limits.max_in_flight == 1


def test_requests_that_name_no_route_share_the_default_line():
    f = Fixture(parallel=1)
    holder = f.acquire(None)
    first, second = f.acquire(None), f.acquire(RouteLimits("named"))
    assert holder.release
    holder.release()
    assert first.release and second.waiting
    assert f.limiter.queued_by_route(H, M) == {"named": 1}
