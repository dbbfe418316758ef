"""The fair queue's rules, one story each: levels, lines, weights, eligibility, reloads."""

from __future__ import annotations

from collections import Counter
from itertools import count

from attrs import define

from crossbar.config.limits import RouteLimits
from crossbar.limiter.fairqueue import FairQueue


@define(eq=False)
class W:
    route: str
    seq: int


class Fixture:
    def __init__(self, **limits: RouteLimits) -> None:
        self.limits = dict(limits)
        self.queue: FairQueue[W] = FairQueue(lambda name: self.limits.get(name, RouteLimits(name)))
        self._seq = count()

    def push(self, route: str, n: int = 1) -> list[W]:
        waiters = [W(route, next(self._seq)) for _ in range(n)]
        for w in waiters:
            self.queue.push(w)
        return waiters

    def take(self, n: int, eligible=lambda route, klass, rank: True) -> list[W]:
        taken = []
        for _ in range(n):
            w = self.queue.take(eligible)
            if w is None:
                break
            taken.append(w)
        return taken


def test_routes_without_weight_share_one_line_in_arrival_order():
    f = Fixture()
    pushed = f.push("a") + f.push("b", 2) + f.push("a") + f.push("c")
    assert f.take(10) == pushed
    assert len(f.queue) == 0


def test_weighted_lines_are_admitted_in_proportion_to_their_weights():
    f = Fixture(a=RouteLimits("a", weight=3), b=RouteLimits("b", weight=1))
    f.push("a", 400)
    f.push("b", 400)
    got = Counter(w.route for w in f.take(400))
    assert got == {"a": 300, "b": 100}


def test_the_shared_line_counts_as_one_line_of_weight_one():
    f = Fixture(heavy=RouteLimits("heavy", weight=2))
    f.push("x", 90)
    f.push("y", 90)
    f.push("heavy", 90)
    got = Counter(w.route for w in f.take(90))
    assert got["heavy"] == 60 and got["x"] + got["y"] == 30
    assert got["x"] > got["y"]  # the shared line is FIFO: x's waiters came first


def test_within_a_weighted_line_the_route_is_fifo():
    f = Fixture(a=RouteLimits("a", weight=5))
    pushed = f.push("a", 5)
    assert f.take(5) == pushed


def test_a_higher_priority_is_taken_before_every_lower_one():
    f = Fixture(
        agent=RouteLimits("agent", priority=1),
        batch=RouteLimits("batch", weight=100),
        low=RouteLimits("low", priority=-1),
    )
    f.push("low", 3)
    f.push("batch", 3)
    agent = f.push("agent", 2)
    assert f.take(2) == agent
    assert [w.route for w in f.take(6)] == ["batch"] * 3 + ["low"] * 3


def test_an_ineligible_route_is_skipped_and_never_blocks_others():
    f = Fixture()
    f.push("capped", 3)
    others = f.push("free", 2)
    assert f.take(5, eligible=lambda route, klass, rank: route != "capped") == others
    assert len(f.queue) == 3 and f.queue.count("capped") == 3


def test_a_line_gets_no_credit_for_the_admissions_it_sat_out():
    f = Fixture(a=RouteLimits("a", weight=1), b=RouteLimits("b", weight=1))
    f.push("a", 50)
    f.push("b", 50)
    f.take(20, eligible=lambda route, klass, rank: route == "a")  # b is at its cap meanwhile
    # b goes next, then they alternate: no burst of 20 b's to "catch up".
    assert [w.route for w in f.take(6)] == ["b", "a", "b", "a", "b", "a"]


def test_a_line_that_was_idle_starts_level_with_the_others():
    f = Fixture(a=RouteLimits("a", weight=1), b=RouteLimits("b", weight=1))
    f.push("a", 30)
    f.take(20)
    f.push("b", 10)
    assert Counter(w.route for w in f.take(10)) == {"a": 5, "b": 5}


def test_removing_a_waiter_keeps_the_order_of_the_rest():
    f = Fixture()
    a, b, c = f.push("r", 3)
    f.queue.remove(b)
    assert f.queue.count("r") == 2
    assert f.take(3) == [a, c]


def test_rearrange_applies_new_limits_to_waiters_already_queued():
    f = Fixture()
    first = f.push("a", 2)
    later = f.push("b", 2)
    f.limits["b"] = RouteLimits("b", priority=1)
    f.queue.rearrange()
    assert f.take(4) == later + first
    f.push("a", 1), f.push("b", 1)
    f.limits["b"] = RouteLimits("b")
    f.queue.rearrange()
    assert [w.route for w in f.take(2)] == ["a", "b"]


def test_rearrange_moves_a_route_between_its_own_line_and_the_shared_one():
    f = Fixture(a=RouteLimits("a", weight=3))
    f.push("a", 8)
    f.push("b", 8)
    f.limits["a"] = RouteLimits("a")  # back to the shared FIFO line: arrival order again
    f.queue.rearrange()
    assert [w.route for w in f.take(16)] == ["a"] * 8 + ["b"] * 8


def test_counts_by_route_follow_every_change():
    f = Fixture()
    f.push("a", 2), f.push("b", 1)
    assert f.queue.by_route() == {"a": 2, "b": 1}
    f.take(1)
    assert f.queue.by_route() == {"a": 1, "b": 1}
    assert f.queue.count("zzz") == 0
