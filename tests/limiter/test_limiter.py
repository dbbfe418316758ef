"""The limiter's rules, one story each, on a fake clock."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock

from crossbar.config.values import parse_config
from crossbar.limiter.slots import Limiter, QueueFull, QueueTimeout, Release

H, M = "titan", "qwen"


def server(**keys):
    """A config whose [server] has `keys` (what a reload hands the limiter)."""
    hosts = {"h": {"url": "http://h:8080", "models": ["m"]}}
    return parse_config({"server": keys, "hosts": hosts})


class Fixture:
    def __init__(self, parallel: int = 2, queue_max: int = 4, queue_timeout: float = 60.0):
        self.clock = Clock()
        self.parallel = {(H, M): parallel}
        self.limiter = Limiter(
            self.clock, lambda h, m: self.parallel.get((h, m), 1), queue_max, queue_timeout
        )

    def acquire(self, host: str = H, model: str = M) -> Outcome:
        return Outcome(self.limiter.acquire(host, model))


class Outcome:
    """Where an acquire's Deferred went: a release, a failure, or still waiting."""

    def __init__(self, d: Deferred[Release]) -> None:
        self.release: Release | None = None
        self.error: BaseException | None = None
        self.deferred = d
        d.addCallbacks(self._ok, self._failed)

    def _ok(self, release: Release) -> None:
        self.release = release

    def _failed(self, failure: Any) -> None:
        self.error = failure.value

    @property
    def waiting(self) -> bool:
        return self.release is None and self.error is None


def test_acquire_takes_a_free_slot_at_once():
    f = Fixture(parallel=2)
    a, b = f.acquire(), f.acquire()
    assert a.release and b.release
    assert f.limiter.in_flight(H, M) == 2
    assert f.limiter.free_slots(H, M) == 0
    assert f.limiter.queued(H, M) == 0


def test_waiters_get_slots_in_fifo_order():
    f = Fixture(parallel=1)
    holder = f.acquire()
    waiters = [f.acquire() for _ in range(3)]
    assert all(w.waiting for w in waiters)
    assert f.limiter.queued(H, M) == 3
    assert holder.release
    holder.release()
    assert [w.waiting for w in waiters] == [False, True, True]
    assert waiters[0].release
    waiters[0].release()
    assert [w.waiting for w in waiters] == [False, False, True]
    assert f.limiter.in_flight(H, M) == 1


def test_a_full_queue_refuses_at_once():
    f = Fixture(parallel=1, queue_max=2, queue_timeout=90)
    f.acquire()
    f.acquire(), f.acquire()
    refused = f.acquire()
    assert isinstance(refused.error, QueueFull)
    assert refused.error.retry_after == 90  # nothing finished yet: 30 s a slot x 3 in line
    assert f.limiter.queued(H, M) == 2


def test_queue_max_zero_serves_free_slots_and_queues_nobody():
    f = Fixture(parallel=1, queue_max=0)
    assert f.acquire().release
    assert isinstance(f.acquire().error, QueueFull)


def test_a_waiter_is_refused_at_queue_timeout():
    f = Fixture(parallel=1, queue_timeout=30)
    f.acquire()
    w = f.acquire()
    f.clock.advance(29.999)
    assert w.waiting
    f.clock.advance(0.001)
    assert isinstance(w.error, QueueTimeout)
    assert w.error.retry_after >= 1
    assert f.limiter.queued(H, M) == 0


def test_a_cancelled_waiter_leaves_the_queue_and_never_holds_a_slot():
    f = Fixture(parallel=1)
    holder = f.acquire()
    gone, next_ = f.acquire(), f.acquire()
    gone.deferred.cancel()
    assert isinstance(gone.error, CancelledError)
    assert f.limiter.queued(H, M) == 1
    assert holder.release
    holder.release()
    assert gone.release is None
    assert next_.release
    assert f.limiter.in_flight(H, M) == 1
    f.clock.advance(3600)  # its timeout was cancelled too: nothing fires late
    assert isinstance(gone.error, CancelledError)


def test_cancelling_after_the_slot_was_granted_changes_nothing():
    f = Fixture(parallel=1)
    a = f.acquire()
    a.deferred.cancel()
    assert a.release and f.limiter.in_flight(H, M) == 1


def test_release_is_idempotent():
    f = Fixture(parallel=1)
    a = f.acquire()
    w1, w2 = f.acquire(), f.acquire()
    assert a.release
    a.release()
    a.release()
    assert not w1.waiting and w2.waiting
    assert f.limiter.in_flight(H, M) == 1


def test_track_never_waits_and_is_never_refused():
    f = Fixture(parallel=1, queue_max=0)
    f.acquire()
    releases = [f.limiter.track(H, M) for _ in range(3)]
    assert f.limiter.in_flight(H, M) == 4
    assert f.limiter.free_slots(H, M) == 0
    for r in releases:
        r()
        r()
    assert f.limiter.in_flight(H, M) == 1


def test_tracked_requests_count_as_load_for_acquire():
    f = Fixture(parallel=2)
    f.limiter.track(H, M)
    f.limiter.track(H, M)
    w = f.acquire()
    assert w.waiting and f.limiter.queued(H, M) == 1


def test_a_release_above_parallel_hands_nothing_to_a_waiter():
    f = Fixture(parallel=2)
    a, b = f.acquire(), f.acquire()
    tracked = f.limiter.track(H, M)  # in flight 3 > parallel 2
    w = f.acquire()
    assert a.release and b.release
    a.release()  # in flight was 3: only decrements
    assert w.waiting and f.limiter.in_flight(H, M) == 2
    tracked()  # in flight was 2 <= 2: the slot goes to the waiter
    assert w.release and f.limiter.in_flight(H, M) == 2


def test_a_release_from_track_hands_its_slot_to_a_waiter():
    f = Fixture(parallel=1)
    tracked = f.limiter.track(H, M)
    w = f.acquire()
    tracked()
    assert w.release and f.limiter.in_flight(H, M) == 1


def test_shrinking_parallel_revokes_no_held_slot():
    f = Fixture(parallel=3)
    holders = [f.acquire() for _ in range(3)]
    f.parallel[(H, M)] = 1
    f.limiter.resized(H, M)
    assert f.limiter.in_flight(H, M) == 3
    w = f.acquire()
    releases = [h.release for h in holders]
    assert all(releases)
    releases[0]()  # type: ignore[misc]
    releases[1]()  # type: ignore[misc]
    assert w.waiting and f.limiter.in_flight(H, M) == 1
    releases[2]()  # type: ignore[misc]
    assert w.release and f.limiter.in_flight(H, M) == 1


def test_growing_parallel_admits_waiters_on_resized():
    f = Fixture(parallel=1)
    f.acquire()
    waiters = [f.acquire() for _ in range(3)]
    f.parallel[(H, M)] = 3
    assert all(w.waiting for w in waiters)
    f.limiter.resized(H, M)
    assert [w.waiting for w in waiters] == [False, False, True]
    assert f.limiter.free_slots(H, M) == 0


def test_growth_nobody_announced_still_serves_the_queue_first():
    f = Fixture(parallel=1)
    f.acquire()
    old = f.acquire()
    f.parallel[(H, M)] = 3
    new = f.acquire()
    assert old.release and new.release
    assert f.limiter.in_flight(H, M) == 3


def test_resized_for_an_unknown_pair_is_harmless():
    Fixture().limiter.resized("nobody", "nothing")


def test_pairs_are_independent():
    f = Fixture(parallel=1)
    f.parallel[("atlas", M)] = 1
    f.acquire()
    assert f.acquire("atlas", M).release
    assert f.acquire(H, "other").release


def test_an_admitted_waiter_releasing_at_once_passes_the_slot_on():
    f = Fixture(parallel=1)
    holder = f.acquire()
    first = f.limiter.acquire(H, M)
    first.addCallback(lambda release: release())
    second = f.acquire()
    assert holder.release
    holder.release()
    assert second.release and f.limiter.in_flight(H, M) == 1


def test_a_reload_changes_limits_for_newcomers_and_keeps_deadlines():
    f = Fixture(parallel=1, queue_max=1, queue_timeout=10)
    f.acquire()
    w = f.acquire()
    f.limiter.reconfigure(server(queue_max=3, queue_timeout="100s"))
    later = f.acquire()
    assert later.waiting
    f.clock.advance(10)
    assert isinstance(w.error, QueueTimeout) and later.waiting
    f.clock.advance(90)
    assert isinstance(later.error, QueueTimeout)
    f.limiter.reconfigure(server(queue_max=0, queue_timeout="100s"))
    assert isinstance(f.acquire().error, QueueFull)


def test_retry_after_estimates_the_wait_from_hold_times():
    f = Fixture(parallel=2, queue_max=2, queue_timeout=300)
    a, b = f.acquire(), f.acquire()
    f.clock.advance(20)
    assert a.release and b.release
    a.release()
    b.release()  # both held 20 s
    f.acquire(), f.acquire(), f.acquire(), f.acquire()
    refused = f.acquire()
    assert isinstance(refused.error, QueueFull)
    assert refused.error.retry_after == pytest.approx(20 * 3 / 2)


def test_before_any_slot_was_released_the_hint_guesses_thirty_seconds_a_slot():
    f = Fixture(parallel=2, queue_max=1, queue_timeout=600)
    f.acquire(), f.acquire(), f.acquire()  # two hold the slots, one waits
    refused = f.acquire()
    assert refused.error.retry_after == pytest.approx(30 * 2 / 2)


def test_retry_after_is_at_least_a_second_and_at_most_queue_timeout():
    f = Fixture(parallel=1, queue_max=0, queue_timeout=0.5)
    a = f.acquire()
    assert isinstance(f.acquire().error, QueueFull)
    assert a.release
    a.release()
    f.acquire()
    refused = f.acquire()
    assert isinstance(refused.error, QueueFull)
    assert refused.error.retry_after == 1.0


def test_snapshot_reports_every_pair_with_counters():
    f = Fixture(parallel=1, queue_max=1, queue_timeout=10)
    f.acquire()
    f.limiter.track(H, M)
    f.acquire()
    f.acquire()  # refused
    f.clock.advance(10)  # the waiter times out
    cancelled = f.acquire()
    cancelled.deferred.cancel()
    (state,) = f.limiter.snapshot()
    assert (state.host, state.model, state.parallel) == (H, M, 1)
    assert (state.in_flight, state.tracked, state.queued, state.free) == (2, 1, 0, 0)
    assert (state.admitted, state.tracked_total) == (1, 1)
    assert (state.refused, state.timed_out, state.cancelled) == (1, 1, 1)


def test_wait_seconds_add_up_the_time_admitted_requests_queued():
    f = Fixture(parallel=1)
    a = f.acquire()
    f.acquire()
    f.clock.advance(7)
    assert a.release
    a.release()
    (state,) = f.limiter.snapshot()
    assert state.wait_seconds == 7


def test_unknown_pairs_read_as_idle():
    f = Fixture()
    assert f.limiter.in_flight("x", "y") == 0
    assert f.limiter.queued("x", "y") == 0
    assert f.limiter.free_slots("x", "y") == 1
