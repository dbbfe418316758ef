"""Hosts: health thresholds, passive failures, discovery, draining, reload — on a fake clock."""

from __future__ import annotations

import pytest
from twisted.internet.error import ConnectionRefusedError

from crossbar.hosts.registry import NoSuchHost
from tests.support.fake_hosts import ATLAS, HANG, TITAN, FakeStore, World, config, fired, run


def test_hosts_start_healthy_so_a_restart_moves_nobody():
    w = World()
    assert w.hosts.names() == ["titan", "atlas"]
    assert w.hosts.healthy("titan") and w.hosts.healthy("atlas")
    assert not w.hosts.healthy("nobody")
    assert w.http.calls == []


def test_unhealthy_after_consecutive_failed_probes_only():
    w = World()
    w.http.health(TITAN, 500)
    w.rounds(2)
    w.http.health(TITAN, 200)
    w.rounds(1)  # a good probe restarts the count
    w.http.health(TITAN, 500)
    w.rounds(2)
    assert w.hosts.healthy("titan")
    w.rounds(1)
    assert not w.hosts.healthy("titan")
    assert w.hosts.healthy("atlas")
    assert w.hosts.flips == {"titan": 1, "atlas": 0}


def test_healthy_again_after_consecutive_good_probes():
    w = World()
    w.http.health(TITAN, 500)
    w.rounds(3)
    w.http.health(TITAN, 200)
    w.rounds(1)
    assert not w.hosts.healthy("titan")
    w.rounds(1)
    assert w.hosts.healthy("titan")
    assert w.hosts.flips["titan"] == 2


def test_a_loading_model_host_is_unhealthy_until_it_answers_200():
    w = World(unhealthy_after=1, healthy_after=1)
    loading = b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'
    w.http.health(TITAN, 503, loading)
    w.rounds(4)
    assert not w.hosts.healthy("titan")
    (titan,) = [s for s in w.hosts.status() if s["name"] == "titan"]
    assert titan["last_probe"]["reason"] == "status 503: Loading model"
    assert "Loading model" in titan["reason"]
    w.http.health(TITAN, 200)
    w.rounds(1)
    assert w.hosts.healthy("titan")


def test_a_hung_probe_fails_at_health_timeout():
    w = World(unhealthy_after=1)
    w.http.set(TITAN + "/health", HANG)
    done = fired(w.hosts.probe_all())
    w.clock.advance(1.999)
    assert not done and w.hosts.healthy("titan")
    w.clock.advance(0.001)
    assert done and not w.hosts.healthy("titan")
    assert w.http.cancelled == [TITAN + "/health"]
    (titan,) = [s for s in w.hosts.status() if s["name"] == "titan"]
    assert titan["last_probe"]["reason"].startswith("timeout")


def test_a_refused_connection_is_a_failed_probe():
    w = World(unhealthy_after=1)
    w.http.set(TITAN + "/health", ConnectionRefusedError())
    w.rounds(1)
    assert not w.hosts.healthy("titan")
    assert w.hosts.status()[0]["last_probe"]["reason"] == "refused"


def test_probes_send_the_api_key_as_bearer_and_never_log_it():
    w = World(unhealthy_after=1)
    w.http.health(TITAN, 401, "bad key sekrit-key")  # even an upstream echoing it is not logged
    w.rounds(1)
    headers = dict((url, h) for url, h in w.http.calls)
    assert headers[TITAN + "/health"] == {"Authorization": "Bearer sekrit-key"}
    assert headers[ATLAS + "/health"] == {}
    assert any("titan is unhealthy" in t for t in w.log.texts)
    assert "sekrit-key" not in repr(w.hosts.status())
    assert not any("sekrit-key" in t for t in w.log.texts)
    assert w.hosts.status()[0]["last_probe"]["reason"] == "status 401: bad key ***"


def test_every_flip_is_logged_with_its_reason():
    w = World(unhealthy_after=1, healthy_after=1)
    w.http.health(TITAN, 500, "boom")
    w.rounds(1)
    w.http.health(TITAN, 200)
    w.rounds(1)
    flips = [t for t in w.log.texts if "healthy" in t]
    assert flips == [
        "host titan is unhealthy: 1 failed probes, last: status 500: boom",
        "host titan is healthy again: 1 good probes",
    ]


def test_a_passive_failure_marks_unhealthy_at_once_and_probes_bring_it_back():
    w = World()
    w.hosts.passive_failure("titan", "connection refused")
    assert not w.hosts.healthy("titan")
    assert any("request failed: connection refused" in t for t in w.log.texts)
    w.rounds(1)
    assert not w.hosts.healthy("titan")
    w.rounds(1)
    assert w.hosts.healthy("titan")
    w.hosts.passive_failure("nobody", "refused")  # a host gone by reload: ignored


def test_passive_ejection_never_takes_the_last_healthy_host_of_a_route():
    w = World()
    assert w.hosts.passive_failure("atlas", "refused", route_hosts=("titan", "atlas"))
    assert not w.hosts.passive_failure("titan", "refused", route_hosts=("titan", "atlas"))
    assert w.hosts.healthy("titan") and not w.hosts.healthy("atlas")
    assert any("last healthy host of its route" in t for t in w.log.texts)
    # Another route with a healthy host left may still take titan out.
    assert w.hosts.passive_failure("titan", "refused")


def test_a_probe_under_way_cannot_undo_a_passive_failure():
    w = World(healthy_after=1)
    w.http.delay = 1.0
    done = fired(w.hosts.probe_all())
    w.hosts.passive_failure("titan", "reset")
    w.clock.advance(1.0)
    assert done and not w.hosts.healthy("titan")
    w.http.delay = 0
    w.rounds(1)
    assert w.hosts.healthy("titan")


def test_discovery_fills_parallel_and_ctx_from_props():
    w = World()
    assert w.hosts.parallel("titan", "qwen") == 1 and w.hosts.ctx("titan", "qwen") is None
    w.http.props(TITAN, total_slots=6, n_ctx=32768)
    w.rounds(1)
    assert w.hosts.parallel("titan", "qwen") == 6
    assert w.hosts.ctx("titan", "qwen") == 32768
    assert w.changes == [("titan", "qwen")]
    w.rounds(3)
    assert w.http.urls().count(TITAN + "/props") == 1  # read once it has succeeded


def test_configured_values_win_over_discovered_ones():
    hosts = {"titan": {"url": TITAN, "models": ["qwen"], "parallel": 2}}
    w = World()
    w.hosts = w.make(config(hosts))
    w.http.props(TITAN, total_slots=6, n_ctx=32768)
    w.rounds(1)
    assert w.hosts.parallel("titan", "qwen") == 2
    assert w.hosts.ctx("titan", "qwen") == 32768
    model = w.hosts.status()[0]["models"][0]
    assert (model["parallel_source"], model["ctx_source"]) == ("config", "props")
    assert w.changes == []


def test_props_is_not_read_when_the_config_sets_everything():
    w = World()
    w.rounds(2)
    assert ATLAS + "/props" not in w.http.urls()
    assert w.hosts.parallel("atlas", "qwen") == 4 and w.hosts.ctx("atlas", "qwen") == 8192


def test_discovery_is_retried_on_good_probes_until_it_succeeds():
    w = World()
    w.rounds(1)  # /props answers 404
    assert w.hosts.parallel("titan", "qwen") == 1
    assert any("cannot read /props for qwen: status 404" in t for t in w.log.texts)
    w.http.props(TITAN, total_slots=3, n_ctx=4096)
    w.rounds(1)
    assert w.hosts.parallel("titan", "qwen") == 3


def test_props_is_read_again_when_a_host_comes_back():
    w = World(unhealthy_after=1, healthy_after=1)
    w.http.props(TITAN, total_slots=3, n_ctx=4096)
    w.rounds(1)
    w.hosts.passive_failure("titan", "reset")
    w.http.props(TITAN, total_slots=8, n_ctx=4096)  # restarted with -np 8
    assert w.hosts.parallel("titan", "qwen") == 3  # the old value serves until then
    w.rounds(1)
    assert w.hosts.parallel("titan", "qwen") == 8
    assert w.changes == [("titan", "qwen"), ("titan", "qwen")]


def test_a_router_host_is_asked_per_model():
    hosts = {"titan": {"url": TITAN, "models": {"qwen": {"upstream": "Qwen 3"}, "gemma": {}}}}
    w = World()
    w.hosts = w.make(config(hosts))
    w.http.props(TITAN, 2, 4096, query="?model=Qwen%203")
    w.http.props(TITAN, 5, 8192, query="?model=gemma")
    w.rounds(1)
    assert w.hosts.parallel("titan", "qwen") == 2 and w.hosts.parallel("titan", "gemma") == 5
    assert w.hosts.ctx("titan", "gemma") == 8192


def test_unknown_pairs_have_one_slot_and_no_ctx():
    w = World()
    assert w.hosts.parallel("nobody", "qwen") == 1 and w.hosts.ctx("titan", "other") is None


def test_draining_survives_a_restart():
    store = FakeStore()
    w = World(store=store)
    run(w.hosts.drain("titan"))
    assert w.hosts.draining("titan") and store.rows == {"titan"}
    restarted = w.make(config())
    assert not restarted.draining("titan")
    run(restarted.load_draining())
    assert restarted.draining("titan") and not restarted.draining("atlas")
    run(restarted.undrain("titan"))
    assert not restarted.draining("titan") and store.rows == set()


def test_draining_is_saved_before_it_takes_effect():
    store = FakeStore()
    w = World(store=store)
    store.broken = True
    with pytest.raises(OSError):
        run(w.hosts.drain("titan"))
    assert not w.hosts.draining("titan")


def test_draining_an_unknown_host_is_refused():
    w = World(store=FakeStore())
    with pytest.raises(NoSuchHost) as e:
        run(w.hosts.drain("tytan"))
    assert str(e.value) == "unknown host 'tytan'"
    assert not w.hosts.draining("tytan")


def test_status_reports_what_the_admin_api_shows():
    w = World()
    run(w.hosts.drain("atlas"))
    w.rounds(1)
    titan, atlas = w.hosts.status()
    assert atlas["draining"] and not titan["draining"]
    assert titan["url"] == TITAN and titan["healthy"] and titan["flips"] == 0
    assert titan["last_probe"] == {"at": 0.0, "ok": True, "reason": "status 200"}
    assert titan["models"] == [
        {
            "name": "qwen",
            "upstream": "qwen",
            "parallel": 1,
            "parallel_source": "default",
            "ctx": None,
            "ctx_source": "default",
            "state": None,  # configured, not discovered
        }
    ]
    assert titan["discover"] is False


def test_status_hides_a_password_in_the_url():
    w = World()
    w.hosts = w.make(config({"titan": {"url": "http://u:pw@titan:8080", "models": ["q"]}}))
    assert w.hosts.status()[0]["url"] == "http://u:***@titan:8080"
