"""Hosts over time: the probe timer, overlapping rounds, errors that must not stop it, reloads."""

from __future__ import annotations

import pytest
from twisted.internet.defer import ensureDeferred

from crossbar.app.service import probe_timer
from crossbar.hosts.registry import Hosts
from crossbar.hosts.schedule import SLOTS, phase
from crossbar.limiter.slots import Limiter
from tests.support.fake_hosts import ATLAS, HANG, TITAN, World, config, fired


def health_times(w: World, base: str) -> list[float]:
    return [t for t, url in w.probed if url == base + "/health"]


def watch(w: World) -> World:
    """Record the clock time of every GET the hosts make, in `w.probed`."""
    w.probed = []  # type: ignore[attr-defined]
    inner = w.http.__call__

    def timed(url: str, headers: object) -> object:
        w.probed.append((w.clock.seconds(), url))  # type: ignore[attr-defined]
        return inner(url, headers)  # type: ignore[arg-type]

    w.hosts._get = timed  # type: ignore[assignment]
    return w


def test_each_host_is_probed_every_health_interval_at_its_own_phase():
    w = watch(World())
    timer = w.timer()
    timer.startService()  # the service ran a round of every host just before
    w.clock.pump([0.05] * 300)  # 15 s
    for name, base in (("titan", TITAN), ("atlas", ATLAS)):
        first = 5 * phase(name)
        assert health_times(w, base) == pytest.approx([first, first + 5, first + 10], abs=0.06)
    assert phase("titan") * SLOTS == int(phase("titan") * SLOTS)  # one of SLOTS groups
    timer.stopService()
    w.clock.pump([5, 5])
    assert len(health_times(w, TITAN) + health_times(w, ATLAS)) == 6  # stopped: no more


def test_two_hundred_hosts_are_spread_over_the_interval_not_probed_in_one_burst():
    hosts = {f"gpu{i:03}": {"url": f"http://gpu{i:03}:8080", "models": ["qwen"], "parallel": 1,
                            "ctx": 4096} for i in range(200)}  # fmt: skip
    w = World(hosts=hosts, health_interval="1s")
    watch(w)
    for name in hosts:
        w.http.health(f"http://{name}:8080", 200)
    timer = w.timer()
    timer.startService()
    w.clock.pump([0.01] * 300)  # three intervals
    per_host = {name: 0 for name in hosts}
    buckets: dict[int, int] = {}
    for at, url in w.probed:
        per_host[url.split("//")[1].split(":")[0]] += 1
        buckets[int(at * 100)] = buckets.get(int(at * 100), 0) + 1
    assert set(per_host.values()) == {3}  # each host once per interval
    # In SLOTS groups per interval, never all 200 at once (as the rounds before did).
    assert len(buckets) >= SLOTS * 3 * 0.9 and max(buckets.values()) <= 3 * 200 / SLOTS
    timer.stopService()


def test_the_first_round_can_be_waited_for_and_ends_within_health_timeout():
    # The service opens its proxy port only when this round is over.
    w = World()
    w.http.set(TITAN + "/health", HANG)
    first = fired(w.hosts.probe_all())
    assert w.http.urls().count(TITAN + "/health") == 1
    w.clock.advance(1)
    assert not first
    w.clock.advance(1)  # health_timeout
    assert first == [None]


def test_a_round_never_overlaps_itself():
    w = World()
    w.http.delay = 1.5
    a = fired(w.hosts.probe_all())
    b = fired(w.hosts.probe_all())  # joins the round under way
    assert len(w.http.calls) == 2
    w.clock.advance(1.5)
    assert not a  # titan's /props is read within the round
    w.clock.advance(1.5)
    assert a == b == [None]
    assert len(w.http.calls) == 3


def test_a_slow_probe_delays_that_hosts_next_one_instead_of_stacking():
    w = watch(World(health_interval="1s", health_timeout="3s"))
    w.http.set(TITAN + "/health", HANG)
    timer = w.timer()
    timer.startService()
    w.clock.pump([0.1] * 80)
    first = phase("titan")
    # Hanging: each probe times out after 3 s and the next starts at once (never two at once).
    assert health_times(w, TITAN) == pytest.approx([first, first + 3, first + 6], abs=0.25)
    assert len(health_times(w, ATLAS)) == 8  # the others keep their pace
    timer.stopService()
    w.hosts.stop()


def test_a_broken_probe_is_logged_and_counted_and_the_loop_goes_on():
    w = World()
    calls = 0

    def broken(url: str, headers: object) -> object:
        nonlocal calls
        calls += 1
        raise RuntimeError("bug in the HTTP layer")

    w.hosts = Hosts(config(unhealthy_after=1), w.clock, log=w.log.logger, get=broken)  # type: ignore[arg-type]
    w.timer().startService()
    w.clock.pump([5, 5])
    assert calls == 4  # two intervals of two hosts: the timer did not stop
    assert not w.hosts.healthy("titan")  # a probe that cannot be made is a failed probe
    w.hosts.stop()


def test_an_error_inside_a_probe_is_counted_and_the_loop_goes_on():
    w = World()

    async def bug(name: str, host: object) -> None:
        raise RuntimeError("bug")

    w.hosts._probe = bug  # type: ignore[method-assign]
    fired(w.hosts.probe_all())
    assert w.hosts.probe_errors == 1  # the first round ended, with its error
    w.timer().startService()
    w.clock.pump([5, 5])
    assert w.hosts.probe_errors == 5
    assert any("health probe round failed" in t for t in w.log.texts)
    assert any("health probe of titan failed" in t for t in w.log.texts)
    w.hosts.stop()


def test_a_listener_that_raises_is_logged_and_others_still_hear():
    w = World()
    w.hosts.add_listener(lambda h, m: 1 / 0)
    heard: list[tuple[str, str]] = []
    w.hosts.add_listener(lambda h, m: heard.append((h, m)))
    w.http.props(TITAN, 4, 4096)
    w.rounds(1)
    assert heard == [("titan", "qwen")]
    assert any("listener failed" in t for t in w.log.texts)


def test_stop_abandons_probes_under_way():
    w = World()
    w.http.set(TITAN + "/health", HANG)
    first = fired(w.hosts.probe_all())
    w.hosts.stop()
    assert first == [None]
    assert TITAN + "/health" in w.http.cancelled
    assert w.hosts.status()[0]["last_probe"] is None  # a cancelled probe is no result
    w.clock.advance(60)


def test_reload_adds_and_removes_hosts_and_keeps_the_state_of_the_rest():
    w = World(unhealthy_after=1)
    w.http.health(TITAN, 500)
    w.rounds(1)
    new = config(
        {
            "titan": {"url": TITAN, "models": ["qwen"], "parallel": 3},
            "vega": {"url": "http://vega:8080", "models": ["qwen"], "parallel": 2},
        },
        unhealthy_after=1,
    )
    w.http.health("http://vega:8080", 200)
    w.hosts.reconfigure(new)
    assert w.hosts.names() == ["titan", "vega"]
    assert not w.hosts.healthy("titan") and w.hosts.healthy("vega")
    assert w.hosts.flips == {"titan": 1, "vega": 0}
    assert not w.hosts.healthy("atlas") and w.hosts.parallel("atlas", "qwen") == 1
    assert sorted(w.changes) == [("titan", "qwen"), ("vega", "qwen")]


def test_reload_tells_listeners_only_about_parallel_that_changed():
    w = World()
    w.http.props(TITAN, 4, 4096)
    w.rounds(1)
    w.changes.clear()
    w.hosts.reconfigure(config())  # same config: nothing changed
    assert w.changes == []
    hosts = {
        "titan": {"url": TITAN, "models": ["qwen"]},
        "atlas": {"url": ATLAS, "models": ["qwen"], "parallel": 1, "ctx": 8192},
    }
    w.hosts.reconfigure(config(hosts))
    assert w.changes == [("atlas", "qwen")]
    assert w.hosts.parallel("titan", "qwen") == 4  # discovered values survive a reload


def test_a_new_url_discards_what_was_discovered_at_the_old_one():
    w = World()
    w.http.props(TITAN, 4, 4096)
    w.rounds(1)
    moved = config({"titan": {"url": "http://titan2:8080", "models": ["qwen"]}})
    w.hosts.reconfigure(moved)
    assert w.hosts.parallel("titan", "qwen") == 1
    w.http.health("http://titan2:8080", 200)
    w.http.props("http://titan2:8080", 2, 2048)
    w.rounds(1)
    assert w.hosts.parallel("titan", "qwen") == 2


def test_a_probe_of_a_removed_host_is_cancelled_and_ignored():
    w = World()
    w.http.set(TITAN + "/health", HANG)
    done = fired(w.hosts.probe_all())
    w.hosts.reconfigure(config({"atlas": {"url": ATLAS, "models": ["qwen"]}}))
    assert done == [None]
    assert w.hosts.names() == ["atlas"]


def test_a_new_health_interval_takes_effect_on_reload():
    w = watch(World())
    timer = w.timer()
    timer.startService()
    timer.reconfigure(config(health_interval="1s"))  # each host starts again at its phase
    w.clock.pump([0.05] * 60)  # 3 s
    first = phase("titan")
    assert health_times(w, TITAN) == pytest.approx([first, first + 1, first + 2], abs=0.06)
    timer.stopService()


def test_the_timer_of_the_service_is_the_one_tested_here():
    w = World()
    assert probe_timer(w.config, w.hosts, w.clock).interval == 5.0


def test_discovered_slots_reach_the_limiter_through_a_listener():
    w = World()
    limiter = Limiter(w.clock, w.hosts.parallel, queue_max=8, queue_timeout=60)
    w.hosts.add_listener(limiter.resized)
    held = [limiter.acquire("titan", "qwen") for _ in range(3)]
    assert limiter.queued("titan", "qwen") == 2  # one slot until /props says otherwise
    w.http.props(TITAN, total_slots=3, n_ctx=4096)
    w.rounds(1)
    assert all(d.called for d in held)
    assert limiter.in_flight("titan", "qwen") == 3 and limiter.queued("titan", "qwen") == 0


def test_a_reload_probes_the_hosts_it_adds_or_moves_at_once_and_reads_their_slots():
    w = World()
    w.http.props(TITAN, 4, 4096)
    w.rounds(1)
    vega = "http://vega:8080"
    w.http.health(vega, 200)
    w.http.props(vega, 6, 8192)
    w.http.health("http://titan2:8080", 200)
    w.http.props("http://titan2:8080", 2, 2048)
    hosts = {
        "titan": {"url": "http://titan2:8080", "models": ["qwen"]},  # moved
        "atlas": {"url": ATLAS, "models": ["qwen"], "parallel": 4, "ctx": 8192},  # as it was
        "vega": {"url": vega, "models": ["qwen"]},  # added
    }
    w.http.calls.clear()
    w.http.delay = 1.0  # the answers take a second: the reload waits for them
    probed = fired(w.hosts.reconfigure(config(hosts)))
    assert not probed and not w.hosts.knows_parallel("vega", "qwen")
    w.clock.advance(1)
    w.clock.advance(1)  # /health, then /props
    assert probed == [None]
    assert sorted(w.http.urls()) == sorted(
        [vega + "/health", vega + "/props", "http://titan2:8080/health", "http://titan2:8080/props"]
    )  # atlas, unchanged, waits for its turn in the spread schedule
    assert w.hosts.parallel("vega", "qwen") == 6 and w.hosts.knows_parallel("vega", "qwen")
    assert w.hosts.parallel("titan", "qwen") == 2
    w.http.calls.clear()
    assert fired(ensureDeferred(w.hosts.probe_fresh())) == [None]
    assert w.http.calls == []  # nothing left to probe


def test_a_host_down_at_its_first_probe_gets_no_new_leases_but_keeps_its_own():
    w = World()
    w.http.health(TITAN, 500)
    assert not w.hosts.held_down("titan")  # not probed yet: nothing known against it
    w.rounds(1)
    # Still healthy (one failed probe of three), so its leases stay where they are, but it
    # has not answered once since crossbar started: no new conversation goes to it blind.
    assert w.hosts.healthy("titan") and w.hosts.held_down("titan")
    assert not w.hosts.held_down("atlas")
    w.http.health(TITAN, 200)
    w.rounds(1)
    assert not w.hosts.held_down("titan")
    w.http.health(TITAN, 500)
    w.rounds(1)
    assert not w.hosts.held_down("titan")  # a later failed probe is the thresholds' business
