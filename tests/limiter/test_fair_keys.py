"""Within a route, the waiters of different client keys share the route's admissions fairly
(by each key's weight), so one key's batch cannot starve the route's other keys; one key's
waiters, and a route without keys, keep arrival order."""

from __future__ import annotations

from itertools import count

from attrs import define
from twisted.internet.task import Clock

from crossbar.config.limits import RouteLimits
from crossbar.limiter import Limiter
from crossbar.limiter.fairqueue import FairQueue


@define(eq=False)
class W:
    route: str
    seq: int
    tenant: str = ""
    tenant_weight: float = 1.0


def queue() -> FairQueue[W]:
    return FairQueue(lambda name: RouteLimits(name))


def test_a_batch_of_one_key_does_not_hold_back_another_key_of_the_same_route():
    q, seq = queue(), count()
    batch = [W("team", next(seq), "ci") for _ in range(20)]
    for w in batch:
        q.push(w)
    alice = [W("team", next(seq), "alice") for _ in range(2)]
    for w in alice:
        q.push(w)
    taken = [q.take(lambda r, k, n: True) for _ in range(6)]
    # Alice's requests came after twenty of the batch, and go second and fourth.
    assert [w.tenant for w in taken] == ["ci", "alice", "ci", "alice", "ci", "ci"]
    assert [w for w in taken if w.tenant == "ci"] == batch[:4]  # in arrival order


def test_key_weights_share_a_routes_admissions_in_proportion():
    q, seq = queue(), count()
    for _ in range(30):
        q.push(W("team", next(seq), "heavy", 3.0))
        q.push(W("team", next(seq), "light", 1.0))
    taken = [q.take(lambda r, k, n: True).tenant for _ in range(20)]
    assert taken.count("heavy") == 15 and taken.count("light") == 5


def test_without_keys_the_route_keeps_its_fifo_across_routes():
    q, seq = queue(), count()
    pushed = [W(route, next(seq)) for route in ("a", "b", "a", "c", "b")]
    for w in pushed:
        q.push(w)
    assert [q.take(lambda r, k, n: True) for _ in range(5)] == pushed


def test_the_limiter_admits_keys_of_a_route_in_turn_into_freed_slots():
    clock = Clock()
    limiter = Limiter(clock, lambda host, model: 1, queue_max=64, queue_timeout=60)
    route = RouteLimits("team")
    holder = limiter.acquire("h", "m", route, ("ci", 1.0)).result
    order: list[str] = []
    releases = []
    for tenant in ["ci"] * 5 + ["alice"]:
        d = limiter.acquire("h", "m", route, (tenant, 1.0))
        d.addCallback(lambda release, t=tenant: (order.append(t), releases.append(release)))
    holder()
    releases[0]()
    releases[1]()
    assert order == ["ci", "alice", "ci"]
