"""Usage rows are written in group commits: at once when the store is idle, and together while
a write is in flight, so a busy crossbar pays one commit per batch, not per request; a flush
(a usage answer, a stop) waits for every finished row."""

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


def recorder(store):
    clock = Clock()
    journal = Journal(store, clock)
    return UsageRecorder(store, IdMemory(size=10, ttl=60), ContextGuard(), clock, journal), journal


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


def test_a_flush_waits_for_the_rows_behind_the_write_in_flight_too():
    store = SlowStore()
    usage, _ = recorder(store)
    usage.finish(Exchange(0.0, route="a"))
    usage.finish(Exchange(0.0, route="b"))  # waits for the write of "a"
    flushed = ensureDeferred(usage.flush())
    store.writes[0][1].callback(None)
    assert routes(store) == [["a"], ["b"]] and not flushed.called
    store.writes[1][1].callback(None)
    assert flushed.called


def test_a_flush_while_the_store_is_down_returns_and_the_rows_wait():
    store = SlowStore()
    usage, journal = recorder(store)
    usage.finish(Exchange(0.0, route="a"))
    flushed = ensureDeferred(usage.flush())
    store.writes[0][1].errback(OSError("disk full"))
    assert flushed.called and journal.degraded
    assert [r.route for r in usage.unsaved] == ["a"]
