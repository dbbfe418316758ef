"""An instance's share of a host's slots counts what the others may be holding, and an
instance that missed its own heartbeats takes none until its next one lands."""

import pytest
from attrs import define, field
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from crossbar.cluster import Instances, KeyShare
from crossbar.cluster.instances import decode_slots, encode_slots
from crossbar.config import KeyLimits, hash_secret
from crossbar.config.values import parse_config
from crossbar.store import InstanceRow, StoreError
from crossbar.tenants import ClientKey, KeyMeter, OverLimit
from tests.support.lease_fakes import run_now

PAIR = ("a", "m")
T0 = 1_780_000_000.0  # a key's clock: inside a UTC day
CONFIG = parse_config(
    {
        "server": {"health_interval": "1s"},
        "hosts": {"a": {"url": "http://a:1", "models": ["m"], "parallel": 4}},
        "routes": {"r": {"hosts": ["a"]}},
    }
)


@define
class Rows:
    """The instances table: the others' rows as the test sets them, on the database's clock."""

    clock: Clock
    others: dict[str, InstanceRow] = field(factory=dict)
    fail: bool = False
    hold: Deferred | None = None

    def other(self, name: str, beat_at: float, in_flight: int = 0) -> None:
        slots = encode_slots({PAIR: in_flight})
        self.others[name] = InstanceRow(name, "", "", "", 0.0, beat_at, in_flight, slots)

    async def heartbeat(self, row: InstanceRow):
        if self.hold is not None:
            await self.hold
        if self.fail:
            raise StoreError("injected")
        now = self.clock.seconds()
        mine = InstanceRow(row.id, "", "", "", 0.0, now, row.in_flight, row.slots)
        return now, sorted([mine, *self.others.values()], key=lambda r: r.id)


def make(rows: Rows, name: str = "x") -> Instances:
    return Instances(rows, CONFIG, name, "v", 0.0, lambda e: None, rows.clock)


def test_the_slots_per_pair_go_to_the_row_and_back():
    assert decode_slots(encode_slots({PAIR: 3, ("b", "m"): 0})) == {PAIR: 3}
    assert decode_slots("") == {} and decode_slots("not json") == {}


def test_two_instances_at_rest_share_a_host_evenly():
    clock = Clock()
    rows = Rows(clock)
    rows.other("y", beat_at=0.0)
    x = make(rows)
    run_now(x.beat())
    assert x.share(4, PAIR) == 2


def test_an_other_still_holding_more_than_its_share_is_counted_at_what_it_holds():
    clock = Clock()
    rows = Rows(clock)
    rows.other("y", beat_at=0.0, in_flight=3)  # admitted while it had the host alone
    x = make(rows)
    run_now(x.beat())
    assert x.share(4, PAIR) == 1  # 4 - 3: never more than the host has
    rows.other("y", beat_at=1.0, in_flight=1)
    clock.advance(1)
    run_now(x.beat())
    assert x.share(4, PAIR) == 2  # y's extra requests ended: the even share again


def test_an_instance_back_from_a_freeze_takes_nothing_until_the_others_know_it():
    clock = Clock()
    rows = Rows(clock)
    rows.other("y", beat_at=0.0)
    x = make(rows)
    run_now(x.beat())
    assert x.share(4, PAIR) == 2
    clock.advance(20)  # frozen: no beat for 20 s; y counted x dead and took every slot
    rows.other("y", beat_at=19.5, in_flight=4)
    assert x.share(4, PAIR) == 0  # before its next beat lands, it takes nothing
    rows.hold = Deferred()
    beating = run_now_later(x.beat())
    assert x.share(4, PAIR) == 0  # the beat under way has not re-read the table yet
    rows.hold, held = None, rows.hold
    held.callback(None)
    assert beating
    # y has not beaten since x came back: it may still use the whole host.
    assert x.share(4, PAIR) == 0
    clock.advance(0.5)
    rows.other("y", beat_at=20.5, in_flight=4)  # y knows x again but still runs its four
    run_now(x.beat())
    assert x.share(4, PAIR) == 0
    clock.advance(0.5)
    rows.other("y", beat_at=21.0, in_flight=2)
    run_now(x.beat())
    assert x.share(4, PAIR) == 2


def test_a_slow_beat_is_not_a_missed_one():
    clock = Clock()
    rows = Rows(clock)
    rows.other("y", beat_at=0.0)
    x = make(rows)
    run_now(x.beat())
    rows.hold = Deferred()
    run_now_later(x.beat())
    clock.advance(10)  # the store takes 10 s to answer: the timer ran, the store is slow
    assert x.share(4, PAIR) == 2


def test_an_instance_alone_whose_store_fails_after_a_freeze_keeps_its_slots():
    clock = Clock()
    rows = Rows(clock)
    x = make(rows)
    run_now(x.beat())
    clock.advance(20)
    rows.fail = True
    run_now(x.beat())  # it was alone: nobody can have taken its slots
    assert x.share(4, PAIR) == 4


def run_now_later(coro):
    """Start a coroutine that waits: a list that gets its result when it ends."""
    from twisted.internet.defer import ensureDeferred

    done = []
    ensureDeferred(coro).addBoth(done.append)
    return done


def test_a_key_with_fewer_requests_a_minute_than_instances_is_still_served():
    # rpm = 1 over two live instances: each one's share is half a request a minute. It
    # serves one when its share is full (one each two minutes), so the key is never
    # refused for ever, and a client behind both is served once a minute.
    clock = Clock()
    rows = Rows(clock)
    rows.other("y", beat_at=0.0)
    x = make(rows)
    run_now(x.beat())
    assert x.live == ["x", "y"]
    meter = KeyMeter(KeyShare(x))
    key = ClientKey("ci", hash_secret("s" * 20), routes=("*",), limits=KeyLimits(rpm=1, tpm=1))
    meter.admit(key, 5.0, T0).settle(1, 0, 0, T0)  # tpm 1: a half-token share, also served
    with pytest.raises(OverLimit) as e:
        meter.admit(key, 5.0, T0 + 60)
    assert e.value.limit == "rpm" and e.value.retry_after == pytest.approx(60)
    meter.admit(key, 5.0, T0 + 120)
