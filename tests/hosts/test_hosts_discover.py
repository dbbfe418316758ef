"""Hosts with `models = "discover"` (router-mode llama-servers), on a fake clock: their models
are what `GET /models` lists; an unloaded model is served and no health failure; each model's
slots and context come from `/props?model=` once it is loaded, never by loading it."""

from __future__ import annotations

import json

import pytest

from crossbar.config.values import ConfigError, parse_config
from tests.support.fake_hosts import ATLAS, TITAN, World, config

ROUTER = {"titan": {"url": TITAN, "models": "discover"}}
PROPS = "?model={}&autoload=false"


def listing(**states: str) -> tuple[int, bytes]:
    data = [{"id": name, "status": {"value": state}} for name, state in states.items()]
    return 200, json.dumps({"object": "list", "data": data}).encode()


def router_world(**host: object) -> World:
    w = World()
    w.hosts = w.make(config({"titan": {**ROUTER["titan"], **host}}))
    return w


def test_a_discovering_host_serves_what_its_models_list_says_loaded_or_not():
    w = router_world()
    assert w.hosts.models("titan") == ()  # nothing known before the first probe
    w.http.set(TITAN + "/models", listing(qwen="loaded", gemma="unloaded"))
    w.http.props(TITAN, 4, 8192, query=PROPS.format("qwen"))
    w.rounds(1)
    assert [m.name for m in w.hosts.models("titan")] == ["qwen", "gemma"]
    assert w.hosts.model("titan", "gemma").upstream_name == "gemma"
    assert w.hosts.healthy("titan")  # an unloaded model is no failure
    assert (w.hosts.parallel("titan", "qwen"), w.hosts.ctx("titan", "qwen")) == (4, 8192)
    # gemma's settings are unknown until it is loaded: asking would load it.
    assert (w.hosts.parallel("titan", "gemma"), w.hosts.ctx("titan", "gemma")) == (1, None)
    assert TITAN + "/props" + PROPS.format("gemma") not in w.http.urls()
    status = w.hosts.status()[0]
    assert status["discover"] is True
    assert [(m["name"], m["state"]) for m in status["models"]] == [
        ("qwen", "loaded"),
        ("gemma", "unloaded"),
    ]
    assert ("titan", "qwen") in w.changes  # the limiter hears of qwen's 4 slots


def test_a_model_loaded_later_has_its_props_read_and_one_unloaded_forgets_them():
    w = router_world()
    w.http.set(TITAN + "/models", listing(qwen="loaded", gemma="unloaded"))
    w.http.props(TITAN, 4, 8192, query=PROPS.format("qwen"))
    w.http.props(TITAN, 2, 16384, query=PROPS.format("gemma"))
    w.rounds(1)
    w.http.set(TITAN + "/models", listing(qwen="unloaded", gemma="loaded"))
    w.rounds(1)
    assert (w.hosts.parallel("titan", "gemma"), w.hosts.ctx("titan", "gemma")) == (2, 16384)
    assert w.hosts.ctx("titan", "qwen") is None  # loaded again, it may have other settings
    w.rounds(2)
    assert w.http.urls().count(TITAN + "/props" + PROPS.format("gemma")) == 1


def test_the_hosts_own_parallel_and_ctx_apply_to_every_discovered_model():
    w = router_world(parallel=3, ctx=4096)
    w.http.set(TITAN + "/models", listing(qwen="loaded", gemma="sleeping"))
    w.rounds(1)
    assert [w.hosts.parallel("titan", m) for m in ("qwen", "gemma")] == [3, 3]
    assert not [url for url in w.http.urls() if "/props?" in url]  # no model's settings


def test_a_model_list_that_cannot_be_read_keeps_what_was_listed_before():
    w = router_world()
    w.http.set(TITAN + "/models", listing(qwen="loaded"))
    w.rounds(1)
    w.http.set(TITAN + "/models", (500, b'{"error": {"message": "busy"}}'))
    w.rounds(1)
    assert [m.name for m in w.hosts.models("titan")] == ["qwen"]
    assert any("cannot read /models: status 500: busy" in t for t in w.log.texts)
    w.http.set(TITAN + "/models", listing(qwen="loaded", llama="unloaded"))
    w.rounds(1)
    assert [m.name for m in w.hosts.models("titan")] == ["qwen", "llama"]
    assert any("host titan serves qwen (loaded), llama (unloaded)" in t for t in w.log.texts)


def test_a_single_model_server_listed_without_status_counts_as_loaded():
    w = router_world()
    body = {"object": "list", "data": [{"id": "gemma-3-270m", "object": "model"}]}
    w.http.set(TITAN + "/models", (200, json.dumps(body).encode()))
    w.rounds(1)
    assert w.hosts.status()[0]["models"][0]["state"] == "loaded"


def test_discover_is_the_only_word_models_takes_and_routes_may_name_what_it_will_list():
    with pytest.raises(ConfigError) as info:
        parse_config({"hosts": {"titan": {"url": TITAN, "models": "auto"}}})
    assert info.value.errors == [
        'hosts.titan.models: must be an array of names, a table per model, or "discover", '
        'not "auto"'
    ]
    routed = parse_config(
        {
            "hosts": ROUTER,
            "routes": {
                "convo": {
                    "hosts": ["titan"],
                    "default_model": "qwen",
                    "aliases": {"claude-*": "qwen"},
                }
            },
        }
    )
    assert routed.hosts["titan"].discover and routed.hosts["titan"].models == ()


def test_check_describes_a_discovering_host_and_what_its_routes_may_serve():
    from crossbar.cli.check import describe

    text = describe(
        parse_config(
            {
                "hosts": {"titan": {"url": TITAN, "models": "discover", "ctx": 8192}},
                "routes": {"convo": {"hosts": ["titan"]}},
            }
        )
    )
    assert "    models discovered from GET /models: parallel from /props, ctx 8192 each" in text
    assert "convo: hosts titan; models (and what the discovering hosts list)" in text


def test_what_a_route_serves_follows_each_new_listing_of_its_hosts():
    hosts = {
        "titan": {"url": TITAN, "models": "discover"},
        "atlas": {"url": ATLAS, "models": ["qwen"], "parallel": 4, "ctx": 8192},
    }
    w = World(hosts=hosts)
    route = parse_config({"hosts": hosts, "routes": {"convo": {"hosts": ["titan", "atlas"]}}})
    convo = route.route("convo")
    w.http.set(TITAN + "/models", listing(gemma="loaded"))
    w.http.props(TITAN, 1, 8192, query=PROPS.format("gemma"))
    w.rounds(1)
    serving = w.hosts.serving(convo)
    assert serving.models == ["gemma", "qwen"]  # host then model order
    assert serving.candidates("qwen") == ("atlas",) and serving.candidates("nope") == ()
    assert w.hosts.serving(convo) is serving  # nothing listed anew: worked out once
    w.http.set(TITAN + "/models", listing(qwen="loaded", gemma="loaded"))
    w.http.props(TITAN, 1, 8192, query=PROPS.format("qwen"))
    w.rounds(1)
    assert w.hosts.serving(convo).candidates("qwen") == ("titan", "atlas")  # route order


def router_props(max_instances: int) -> tuple[int, bytes]:
    body = {"role": "router", "max_instances": max_instances, "models_autoload": True}
    return 200, json.dumps(body).encode()


def test_how_many_models_a_router_holds_is_its_max_loaded_else_what_its_props_say():
    w = router_world()
    w.http.set(TITAN + "/props", router_props(2))
    w.http.set(TITAN + "/models", listing(qwen="loaded", gemma="unloaded"))
    w.rounds(2)
    assert w.hosts.capacity("titan") == 2
    assert w.http.urls().count(TITAN + "/props") == 1  # read once while the host stays up
    configured = router_world(max_loaded=1)
    configured.http.set(TITAN + "/props", router_props(4))
    configured.http.set(TITAN + "/models", listing(qwen="loaded"))
    configured.rounds(1)
    assert configured.hosts.capacity("titan") == 1
    assert TITAN + "/props" not in configured.http.urls()


def test_a_routers_loads_and_unloads_seen_in_its_listing_are_told_with_their_reason():
    w = router_world()
    seen = []
    w.hosts.model_listeners.append(seen.append)
    w.http.set(TITAN + "/models", listing(qwen="loaded", gemma="unloaded"))
    w.rounds(1)
    w.http.set(TITAN + "/models", listing(qwen="unloaded", gemma="loading"))
    w.rounds(1)
    assert [(e.kind, e.model, e.reason) for e in seen] == [
        ("unload", "qwen", "router"),
        ("load", "gemma", "router"),
    ]
    assert list(w.hosts.model_events) == seen
    assert any("host titan model qwen: unload (router)" in t for t in w.log.texts)


def test_a_kept_model_the_router_lists_unloaded_is_loaded_again_through_its_api():
    w = router_world(keep_loaded=["qwen"], max_loaded=2)
    w.http.set(TITAN + "/models", listing(qwen="unloaded", gemma="loaded"))
    w.rounds(1)
    assert w.http.posted == [(TITAN + "/models/load", {"model": "qwen"})]
    assert w.hosts.model_state("titan", "qwen") == "loading"
    assert [(e.kind, e.reason) for e in w.hosts.model_events] == [("load", "keep")]
    w.http.set(TITAN + "/models", listing(qwen="loaded", gemma="loaded"))
    w.rounds(1)
    assert len(w.http.posted) == 1  # loaded: nothing more to do


def test_a_routers_props_that_fail_for_a_moving_model_are_no_warning():
    w = router_world()
    w.http.set(TITAN + "/models", listing(qwen="loaded"))
    w.http.set(TITAN + "/props" + PROPS.format("qwen"), (500, b'{"error": "proxy error"}'))
    w.rounds(1)
    lines = [e for e in w.log.events if "cannot read /props for" in e.get("log_format", "")]
    assert lines and all(e["log_level"].name == "info" for e in lines)
    assert w.hosts.healthy("titan")


def test_router_mode_keys_belong_to_router_mode_hosts_and_keep_a_place_free():
    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "hosts": {
                    "titan": {"url": TITAN, "models": ["qwen"], "max_loaded": 2},
                    "atlas": {"url": ATLAS, "models": "discover", "max_loaded": 1,
                              "keep_loaded": ["qwen"]},
                }
            }
        )  # fmt: skip
    assert info.value.errors == [
        'hosts.titan.max_loaded: only for a router-mode host (models = "discover")',
        "hosts.atlas.keep_loaded: keeps 1 model(s) loaded but max_loaded is 1: leave at least "
        "one place for the others",
    ]
    ok = parse_config({"hosts": {"titan": {"url": TITAN, "models": "discover",
                                           "swap_after": "1m", "keep_loaded": ["qwen"]}}})  # fmt: skip
    assert ok.hosts["titan"].swap_after == 60.0 and ok.hosts["titan"].keep_loaded == ("qwen",)
