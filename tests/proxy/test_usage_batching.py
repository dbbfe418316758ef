"""Usage rows are written in group commits: at once when the store is idle, and together while
a write is in flight, so a busy crossbar pays one commit per batch, not per request; with a
pace, a write starts no sooner than that after the one before, and a stop writes what waits."""

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.task import Clock

from crossbar.leases.journal import Journal
from crossbar.proxy.guard import ContextGuard
from crossbar.proxy.ids import IdMemory
from crossbar.proxy.usage import UsageRecorder
from crossbar.wire.exchange import Exchange


class SlowStore:
    """Each write waits until the test fires it."""

    def __init__(self) -> None:
        self.writes: list[tuple[list, Deferred]] = []

    def record_usage_rows(self, rows):
        d = Deferred()
        self.writes.append(([r.route for r in rows], d))
        return d

    async def write(self, change, durable=False):  # the journal's; unused here
        raise AssertionError("no lease writes in this story")

    async def ping(self):
        pass


def recorder(store, clock=None, pace=0.0):
    clock = clock or Clock()
    journal = Journal(store, clock)
    usage = UsageRecorder(
        store, IdMemory(size=10, ttl=60), ContextGuard(), clock, journal, pace=pace
    )
    return usage, journal


def routes(store):
    return [names for names, _ in store.writes]


def test_rows_finishing_during_a_write_go_together_in_the_next_one():
    store = SlowStore()
    usage, _ = recorder(store)
    usage.finish(Exchange(0.0, route="a"))
    assert [routes for routes, _ in store.writes] == [["a"]]  # idle: written at once
    for route in ("b", "c", "d"):
        usage.finish(Exchange(0.0, route=route))
    assert len(store.writes) == 1  # waiting for the write in flight
    store.writes[0][1].callback(None)
    assert [routes for routes, _ in store.writes] == [["a"], ["b", "c", "d"]]
    store.writes[1][1].callback(None)
    usage.finish(Exchange(0.0, route="e"))
    assert [routes for routes, _ in store.writes][-1] == ["e"]


def test_a_refused_batch_and_the_rows_behind_it_wait_for_the_store_to_recover():
    store = SlowStore()
    usage, journal = recorder(store)
    usage.finish(Exchange(0.0, route="a"))
    usage.finish(Exchange(0.0, route="b"))  # behind the write in flight
    store.writes[0][1].errback(OSError("disk full"))
    assert journal.degraded
    assert [r.route for r in usage.unsaved] == ["a", "b"]
    usage.finish(Exchange(0.0, route="c"))  # degraded: held, not written
    assert len(store.writes) == 1 and [r.route for r in usage.unsaved] == ["a", "b", "c"]


def test_with_a_pace_a_write_starts_no_sooner_than_that_after_the_last():
    store, clock = SlowStore(), Clock()
    usage, _ = recorder(store, clock, pace=0.1)
    usage.finish(Exchange(0.0, route="a"))
    assert routes(store) == [["a"]]  # idle: at once
    store.writes[0][1].callback(None)
    clock.advance(0.04)
    usage.finish(Exchange(0.0, route="b"))
    usage.finish(Exchange(0.0, route="c"))
    assert routes(store) == [["a"]]  # landed, but the last write began 0.04 s ago
    clock.advance(0.06)
    assert routes(store) == [["a"], ["b", "c"]]
    store.writes[1][1].callback(None)
    clock.advance(1)
    usage.finish(Exchange(0.0, route="d"))
    assert routes(store)[-1] == ["d"]  # idle longer than the pace: at once again


def test_a_write_that_takes_longer_than_the_pace_is_followed_at_once():
    store, clock = SlowStore(), Clock()
    usage, _ = recorder(store, clock, pace=0.1)
    usage.finish(Exchange(0.0, route="a"))
    usage.finish(Exchange(0.0, route="b"))
    clock.advance(0.5)
    store.writes[0][1].callback(None)
    assert routes(store) == [["a"], ["b"]]


def test_close_writes_the_rows_waiting_for_the_pace_and_waits_for_them():
    store, clock = SlowStore(), Clock()
    usage, _ = recorder(store, clock, pace=0.1)
    usage.finish(Exchange(0.0, route="a"))
    store.writes[0][1].callback(None)
    usage.finish(Exchange(0.0, route="b"))
    closed = ensureDeferred(usage.close())
    assert routes(store) == [["a"], ["b"]] and not closed.called
    store.writes[1][1].callback(None)
    assert closed.called
    clock.advance(1)
    assert routes(store) == [["a"], ["b"]]  # the pace's timer went with the close
