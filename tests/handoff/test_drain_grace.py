"""A drain's grace on a Clock: when it ends the host's running streams are stopped (cause
"drained") if the host still drains; an undrain, or a later grace, changes that."""

from __future__ import annotations

from typing import Any

from attrs import define, field
from twisted.internet.task import Clock

from crossbar.handoff import Evacuator


@define
class Streams:
    """Streams running per host, as the proxy's Resumer counts and stops them."""

    running: dict[str, int] = field(factory=dict)
    stops: list[tuple[str, str]] = field(factory=list)

    def streaming(self, host: str) -> int:
        return self.running.get(host, 0)

    def stop(self, host: str, why: str) -> int:
        self.stops.append((host, why))
        return self.running.pop(host, 0)


@define
class Hosts:
    drained: set[str] = field(factory=set)

    def draining(self, host: str) -> bool:
        return host in self.drained


def evacuator(clock: Clock, hosts: Hosts, streams: Streams) -> Evacuator:
    none: Any = None  # the moves' parts: a grace needs none of them
    made = Evacuator(clock, none, none, hosts, none, none)  # type: ignore[arg-type]
    made.streams = streams
    return made


def test_the_streams_still_running_when_the_grace_ends_are_stopped():
    clock, hosts, streams = Clock(), Hosts({"titan"}), Streams({"titan": 3})
    e = evacuator(clock, hosts, streams)
    assert e.stop_after("titan", 30.0) == 0
    assert e.grace_ends("titan") == 30.0 and e.streaming("titan") == 3
    clock.advance(29.9)
    assert streams.stops == []
    clock.advance(0.1)
    assert streams.stops == [("titan", "drained")]
    assert e.grace_ends("titan") is None


def test_an_undrain_before_the_grace_ends_stops_nothing():
    clock, hosts, streams = Clock(), Hosts({"titan"}), Streams({"titan": 3})
    e = evacuator(clock, hosts, streams)
    e.stop_after("titan", 30.0)
    clock.advance(10)
    hosts.drained.clear()
    assert e.cancel_grace("titan") is True
    clock.advance(60)
    assert streams.stops == [] and clock.getDelayedCalls() == []
    assert e.cancel_grace("titan") is False  # nothing left to forget


def test_a_host_undrained_elsewhere_keeps_its_streams_when_the_grace_ends():
    # Another instance undrained it (the store's change followed): this one's timer finds the
    # host taking leases again and stops nothing.
    clock, hosts, streams = Clock(), Hosts({"titan"}), Streams({"titan": 3})
    e = evacuator(clock, hosts, streams)
    e.stop_after("titan", 5.0)
    hosts.drained.clear()
    clock.advance(5)
    assert streams.stops == []


def test_a_later_grace_replaces_the_earlier_and_zero_stops_at_once():
    clock, hosts, streams = Clock(), Hosts({"titan"}), Streams({"titan": 2})
    e = evacuator(clock, hosts, streams)
    e.stop_after("titan", 60.0)
    e.stop_after("titan", 5.0)
    assert len(clock.getDelayedCalls()) == 1 and e.grace_ends("titan") == 5.0
    assert e.stop_after("titan", 0) == 2  # now: the pending grace is forgotten
    assert streams.stops == [("titan", "drained")] and clock.getDelayedCalls() == []


def test_without_the_proxy_wired_there_is_nothing_to_stop():
    clock, hosts = Clock(), Hosts({"titan"})
    e = evacuator(clock, hosts, Streams({"titan": 1}))
    e.streams = None
    assert e.stop_after("titan", 0) == 0 and e.streaming("titan") == 0
