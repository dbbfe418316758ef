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
                "routes": {
                    "convo": {"hosts": [H]},
                    "bulk": {"hosts": [H], "batch_slots": 1},
                },
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
    assert batch.waiting  # the one slot stays the turns' for a while after theirs (below)
    f.clock.advance(10)
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


def test_batch_leaves_a_host_the_slots_its_turns_held_lately_and_takes_them_back_after():
    f = Fixture(parallel=2)
    a, b = f.acquire(INTERACTIVE), f.acquire(INTERACTIVE)  # two agents' turns at once
    a.release()
    b.release()
    f.clock.advance(1)  # the agents think; their next turns should find their slots
    batch = [f.acquire(BATCH) for _ in range(2)]
    assert [o.release is not None for o in batch] == [False, False]
    assert f.limiter.batch_cap(H, M) == 0
    f.clock.advance(10)  # no turn within RESERVE_WINDOW: every slot but one is batch's
    assert [o.release is not None for o in batch] == [True, False]
    turn = f.acquire(INTERACTIVE)
    assert turn.release  # the slot left free


def test_a_batch_waiter_aged_to_the_top_class_takes_a_slot_whatever_the_turns_hold():
    f = Fixture(parallel=2, aging="10s")
    turns = [f.acquire(INTERACTIVE), f.acquire(INTERACTIVE)]
    old = f.acquire(BATCH)
    for _ in range(25):  # the turns keep both slots busy, one after another, for 25 s
        f.clock.advance(1)
        holder = next(o for o in turns if o.release and not getattr(o, "done", False))
        holder.done = True
        holder.release()
        turns.append(f.acquire(INTERACTIVE))
        if old.release:
            break
    assert old.release and f.clock.seconds() <= 22  # batch at 20 s waits as interactive


def test_a_batch_waiter_held_by_the_turns_takes_the_slot_when_their_window_passes_unprompted():
    f = Fixture(parallel=2, aging="10s")
    turns = [f.acquire(INTERACTIVE), f.acquire(INTERACTIVE)]
    turns[0].release()  # one turn ends; the other runs on for a minute, and nobody arrives
    old = f.acquire(BATCH)
    assert old.waiting  # the slot stays the turns' within the window (10 s)
    f.clock.advance(10)
    assert old.release  # the window passed: no event but time, and batch takes it


def test_batch_room_is_what_the_cap_lets_start_now_less_the_batch_already_waiting():
    f = Fixture(parallel=4)
    assert f.limiter.batch_room(H, M, "convo") == 3  # nothing asked yet: all slots but one
    assert f.limiter.batch_room(H, M, "bulk") == 1  # the route's own batch_slots
    turns = [f.acquire(INTERACTIVE) for _ in range(2)]
    assert f.limiter.batch_room(H, M, "convo") == 2  # the cap follows the turns
    flood = [f.acquire(BATCH) for _ in range(5)]
    assert sum(1 for o in flood if o.release) == 2
    assert f.limiter.batch_room(H, M, "convo") == -3  # three wait past the cap
    for turn in turns:
        turn.release()
    assert f.limiter.batch_room(H, M, "convo") == -3  # the turns' window still holds
