"""A host that flaps is held out of new placements for a hold-down that grows with its recent
falls; a host that stays down logs a summary at most once a minute; probes log no Twisted
factory noise."""

from __future__ import annotations

import pytest_twisted
from twisted.logger import formatEvent, globalLogPublisher

from crossbar.leases.chooser import Chooser, HostView, pick
from crossbar.leases.table import Key, Table
from tests.hosts.test_hosts_http import closed_port, make_hosts, probe
from tests.support.fake_hosts import TITAN, LogCapture, World
from tests.support.lease_fakes import FakeHosts, MemoryStore, run_now


def flapping_world(**server: object) -> World:
    defaults = {"unhealthy_after": 1, "healthy_after": 1, "flap_holddown": "30s"}
    return World(**{**defaults, **server})


def fall_and_rise(w: World, down_for: float = 5.0) -> None:
    w.http.health(TITAN, 503, "Loading model")
    w.rounds(1)
    w.clock.advance(down_for)
    w.http.health(TITAN, 200)
    w.rounds(1)


def titan(w: World) -> dict:
    return next(h for h in w.hosts.status() if h["name"] == "titan")


def test_one_fall_holds_nothing_a_restart_is_not_a_flap():
    w = flapping_world()
    fall_and_rise(w)
    assert w.hosts.healthy("titan") and not w.hosts.held_down("titan")
    assert titan(w)["recent_falls"] == 1 and titan(w)["held_down"] is False


def test_the_hold_down_grows_with_each_fall_within_the_window_and_ends_by_itself():
    w = flapping_world()
    fall_and_rise(w)
    w.clock.advance(10)
    fall_and_rise(w)  # second fall: 30 s
    assert w.hosts.healthy("titan") and w.hosts.held_down("titan")
    assert titan(w)["held_for"] == 30.0 and titan(w)["recent_falls"] == 2
    assert any("held out of new placements for 30s" in t for t in w.log.texts)
    w.clock.advance(30)
    assert not w.hosts.held_down("titan")
    fall_and_rise(w)  # third fall: 60 s
    assert titan(w)["held_for"] == 60.0
    w.clock.advance(59)
    assert w.hosts.held_down("titan")


def test_falls_older_than_the_window_are_forgotten_and_the_hold_is_capped():
    w = flapping_world(flap_window="2m", flap_holddown_max="45s")
    for _ in range(4):
        w.clock.advance(1)
        fall_and_rise(w)
    assert titan(w)["held_for"] == 45.0  # 30 s x 3 earlier falls, capped
    w.clock.advance(200)
    fall_and_rise(w)  # the others are out of the window: a first fall again
    assert not w.hosts.held_down("titan") and titan(w)["recent_falls"] == 1


def test_a_passive_failure_counts_as_a_fall():
    w = flapping_world()
    w.hosts.passive_failure("titan", "refused")
    w.rounds(1)
    fall_and_rise(w)
    assert w.hosts.held_down("titan")


def test_the_chooser_passes_over_a_held_host_even_with_the_fewest_leases():
    views = [HostView("a", False, 9, 1, 0), HostView("b", False, 0, 1, 1, held=True)]
    assert pick(views) == "a"
    assert pick([HostView("b", False, 0, 1, 1, held=True)]) == "b"  # the only one: still used


class Capacity:
    def parallel(self, host: str, model: str) -> int:
        return 4

    def free_slots(self, host: str, model: str) -> int:
        return 4

    def in_flight(self, host: str, model: str) -> int:
        return 0

    def queued(self, host: str, model: str) -> int:
        return 0

    def batch_room(self, host: str, model: str, route: str = "") -> int:
        return 1


def test_new_conversations_avoid_a_held_host_and_old_ones_go_back_to_it():
    hosts = FakeHosts()
    table = run_now(Table.load(MemoryStore(), hosts, Chooser(Capacity(), hosts.held_down), 3600))
    old = Key("r", "old", "m")
    assert run_now(table.acquire(old, ["a", "b"], 0.0)).host == "a"
    hosts.held.add("a")  # a flapped and came back
    for i in range(4):
        assert run_now(table.acquire(Key("r", f"new{i}", "m"), ["a", "b"], 1.0)).host == "b"
    got = run_now(table.acquire(old, ["a", "b"], 2.0))
    assert got.host == "a" and got.reused  # the seed's rule: a lease on a healthy host decides


def test_a_host_that_stays_down_logs_a_summary_at_most_once_a_minute():
    w = flapping_world(unhealthy_after=3)
    w.http.health(TITAN, 503, "Loading model")
    for _ in range(60):  # five minutes of probes every 5 s
        w.rounds(1)
        w.clock.advance(5)
    titan_lines = [t for t in w.log.texts if "titan" in t]
    assert len([t for t in titan_lines if "is unhealthy" in t]) == 1
    summaries = [t for t in titan_lines if "still unhealthy" in t]
    assert 4 <= len(summaries) <= 5
    assert "12 probes failed since the last line" in summaries[1]


@pytest_twisted.ensureDeferred
async def test_probes_of_a_down_host_log_no_twisted_factory_lines() -> None:
    seen: list[dict] = []
    globalLogPublisher.addObserver(seen.append)
    hosts = make_hosts(f"http://127.0.0.1:{closed_port()}", LogCapture())
    try:
        for _ in range(3):
            await probe(hosts)
    finally:
        globalLogPublisher.removeObserver(seen.append)
        await hosts.stop()
    assert not hosts.healthy("titan")
    assert [t for t in map(formatEvent, seen) if "factory" in t.lower()] == []
