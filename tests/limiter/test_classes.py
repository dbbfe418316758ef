"""Request classes in the limiter, one story each on a fake clock: an interactive turn is
admitted before a standard request, a standard one before batch; batch never holds the last
slot of a (host, model); and aging lets no class wait for ever behind a higher one."""

from __future__ import annotations

from twisted.internet.task import Clock

from crossbar.config.limits import RouteLimits
from crossbar.config.values import parse_config
from crossbar.limiter.slots import Limiter
from tests.limiter.test_limiter import Outcome

H, M = "titan", "qwen"
BATCH, STANDARD, INTERACTIVE = 0, 1, 2
ROUTE = RouteLimits("convo")


class Fixture:
    def __init__(self, parallel: int = 1, aging: str = "30s") -> None:
        self.clock = Clock()
        config = parse_config(
            {
                "server": {"queue_max": 1000, "queue_timeout": "10m", "class_aging": aging},
                "hosts": {H: {"url": "http://h:1", "models": [M]}},
                "routes": {"convo": {"hosts": [H]}, "bulk": {"hosts": [H], "batch_slots": 1}},
            }
        )
        self.limiter = Limiter(self.clock, lambda h, m: parallel, 1000, 600.0, config)

    def acquire(self, klass: int, route: RouteLimits = ROUTE) -> Outcome:
        return Outcome(self.limiter.acquire(H, M, route, klass=klass))


def test_a_free_slot_goes_to_the_highest_class_waiting_whatever_came_first():
    f = Fixture(parallel=1)
    holder = f.acquire(STANDARD)
    batch, standard, interactive = f.acquire(BATCH), f.acquire(STANDARD), f.acquire(INTERACTIVE)
    assert holder.release and batch.waiting and standard.waiting and interactive.waiting
    holder.release()
    assert interactive.release and standard.waiting and batch.waiting
    interactive.release()
    assert standard.release and batch.waiting
    standard.release()
    assert batch.release


def test_batch_never_holds_the_last_slot_and_a_turn_arriving_finds_it_free():
    f = Fixture(parallel=4)
    flood = [f.acquire(BATCH) for _ in range(10)]
    assert sum(1 for o in flood if o.release) == 3  # all slots but one
    assert f.limiter.free_slots(H, M) == 1
    turn = f.acquire(INTERACTIVE)
    assert turn.release  # at once, on the slot batch left
    turn.release()
    assert f.limiter.free_slots(H, M) == 1  # still not batch's
    next(o for o in flood if o.release).release()
    assert sum(1 for o in flood if o.release) == 4  # one batch release lets the next batch in


def test_a_route_may_set_its_batch_slots_and_one_slot_is_still_batchs_to_take():
    f = Fixture(parallel=4)
    bulk = RouteLimits("bulk", batch_slots=1)
    flood = [f.acquire(BATCH, bulk) for _ in range(3)]
    assert [o.release is not None for o in flood] == [True, False, False]
    alone = Fixture(parallel=1)  # one slot: batch may take it, or never run
    assert alone.acquire(BATCH).release


def test_a_batch_request_rises_a_class_each_class_aging_and_is_not_starved():
    f = Fixture(parallel=1, aging="10s")
    turns = [f.acquire(INTERACTIVE)]
    old = f.acquire(BATCH)
    released, second = set(), 0
    while not old.release and second < 60:  # a turn arrives every second, each holding 1 s
        second += 1
        turns.append(f.acquire(INTERACTIVE))
        f.clock.advance(1)
        holding = next(o for o in turns if o.release and id(o) not in released)
        released.add(id(holding))
        holding.release()
    # Batch at first, standard after 10 s, interactive after 20 s: then it shares that class's
    # admissions with the turns (a line of its own), and goes within a turn or two.
    assert old.release and 20 <= second <= 22, second


def test_with_every_waiter_of_one_class_aging_changes_nothing():
    f = Fixture(parallel=1, aging="1s")
    holder = f.acquire(BATCH)
    waiting = [f.acquire(BATCH) for _ in range(3)]
    f.clock.advance(100)
    holder.release()
    assert [o.release is not None for o in waiting] == [True, False, False]  # arrival order
