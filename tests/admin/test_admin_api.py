"""The admin API over a real crossbar: what each endpoint shows and does, and its errors."""

import json

import pytest
import pytest_twisted

from crossbar.admin.api import Admin
from crossbar.limiter.rates import _Rate
from tests.support.admin_harness import conversation, start_service, write_config
from tests.support.harness import MODEL, start_fakes, turn, wait
from tests.support.routes import CONVO_AND_SOLO

ROUTES = CONVO_AND_SOLO
TEMPLATES = {
    "projects": {
        "match": "proj-*",
        "hosts": ["atlas"],
        "default_model": MODEL,
        "fallbacks": ["solo"],
        "fallback_after": "30s",
    }
}


@pytest_twisted.async_yield_fixture
async def crossbar(tmp_path):
    fakes = await start_fakes("titan", "atlas")
    path = write_config(tmp_path / "crossbar.toml", fakes, ROUTES, templates=TEMPLATES)
    running = await start_service(path, fakes)
    yield running
    await running.stop()


@pytest_twisted.ensureDeferred
async def test_leases_lists_every_conversation_with_its_host_and_idle_time(crossbar):
    await crossbar.chat("convo", conversation("a"))
    await crossbar.chat("convo", conversation("b"))
    await crossbar.chat("solo", conversation("c"))
    leases = (await crossbar.get("/api/leases"))["leases"]
    assert [(x["route"], x["model"], x["state"]) for x in leases] == [
        ("convo", MODEL, "active"),
        ("convo", MODEL, "active"),
        ("solo", MODEL, "active"),
    ]
    assert {x["host"] for x in leases if x["route"] == "convo"} == {"titan", "atlas"}
    first = leases[0]
    assert set(first) == {
        "route", "fp", "model", "host", "state", "created", "last_used", "idle_for",
    }  # fmt: skip
    assert len(first["fp"]) == 16 and first["idle_for"] >= 0
    assert len((await crossbar.get("/api/leases?route="))["leases"]) == 3
    only = (await crossbar.get("/api/leases?route=solo"))["leases"]
    assert [(x["route"], x["host"]) for x in only] == [("solo", "titan")]


@pytest_twisted.ensureDeferred
async def test_release_drops_a_routes_leases_and_says_how_many(crossbar):
    await crossbar.chat("convo", conversation("a"))
    await crossbar.chat("convo", conversation("b"))
    await crossbar.chat("solo", conversation("c"))
    code, body, _ = await crossbar.call("DELETE", "/api/routes/convo/leases")
    assert (code, body) == (200, {"route": "convo", "released": 2})
    left = (await crossbar.get("/api/leases"))["leases"]
    assert [x["route"] for x in left] == ["solo"]
    events = (await crossbar.get("/api/events?route=convo"))["events"]
    assert [e["reason"] for e in events[:2]] == ["release", "release"]


@pytest_twisted.ensureDeferred
async def test_a_pin_sends_the_next_request_to_the_pinned_host_and_removes_leases_elsewhere(
    crossbar,
):
    for name in ("a", "b"):
        await crossbar.chat("convo", conversation(name))
    before = {x["fp"]: x["host"] for x in (await crossbar.get("/api/leases"))["leases"]}
    assert sorted(before.values()) == ["atlas", "titan"]
    (on_titan,) = [fp for fp, host in before.items() if host == "titan"]
    code, body, _ = await crossbar.call("PUT", "/api/routes/convo/pin", {"host": "atlas"})
    assert (code, body) == (200, {"route": "convo", "pinned": "atlas", "healthy": True})
    leases = (await crossbar.get("/api/leases?route=convo"))["leases"]
    assert [x["host"] for x in leases] == ["atlas"]  # the lease on titan is gone
    for name in ("a", "b"):
        host, _ = await crossbar.chat("convo", conversation(name))
        assert host == "atlas"
    events = (await crossbar.get("/api/events?route=convo&limit=10"))["events"]
    pins = [(e["fp"], e["from_host"], e["to_host"]) for e in events if e["reason"] == "pin"]
    assert sorted(pins) == [("", "", "atlas"), (on_titan, "titan", "atlas")]
    routes = {r["name"]: r for r in (await crossbar.get("/api/routes"))["routes"]}
    assert routes["convo"]["pinned"] == "atlas"

    code, body, _ = await crossbar.call("DELETE", "/api/routes/convo/pin")
    assert (code, body) == (200, {"route": "convo", "unpinned": "atlas"})
    code, body, _ = await crossbar.call("DELETE", "/api/routes/convo/pin")
    assert (code, body) == (200, {"route": "convo", "unpinned": None})
    assert (await crossbar.get("/api/routes"))["routes"][0]["pinned"] is None


@pytest_twisted.ensureDeferred
async def test_pin_errors_say_what_is_wrong(crossbar):
    cases = [
        ("/api/routes/convo/pin", {"host": "orion"}, 409, "not one of route 'convo'"),
        ("/api/routes/solo/pin", {"host": "atlas"}, 409, "(titan)"),
        ("/api/routes/convo/pin", {"host": crossbar.fakes["titan"].url}, 409, "by name"),
        ("/api/routes/nowhere/pin", {"host": "titan"}, 404, "no route or template"),
        ("/api/routes/convo/pin", b"{not json", 400, "not valid JSON"),
        ("/api/routes/convo/pin", [1, 2], 400, "must be a JSON object"),
        ("/api/routes/convo/pin", {"hots": "titan"}, 400, '{"host": "<name>"}'),
    ]
    for path, body, status, words in cases:
        code, answer, _ = await crossbar.call("PUT", path, body)
        assert code == status, (path, body, answer)
        error = answer["error"]
        assert error["code"] == status and words in error["message"], error
        assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert crossbar.parts.table.pins() == {}


@pytest_twisted.ensureDeferred
async def test_routes_lists_concrete_routes_and_template_routes_that_were_used(crossbar):
    await crossbar.chat("proj-alpha", conversation("a"))
    await crossbar.chat("convo", conversation("b"))
    answer = await crossbar.get("/api/routes")
    routes = answer["routes"]
    assert [r["name"] for r in routes] == ["convo", "solo", "proj-alpha"]
    assert answer["total"] == 3
    alpha = routes[2]
    assert alpha["template"] == "projects"
    assert (alpha["configured"], alpha["served"]) == (False, True)
    assert (routes[0]["configured"], routes[0]["served"]) == (True, True)
    first = await crossbar.get("/api/routes?limit=1")
    assert [r["name"] for r in first["routes"]] == ["convo"] and first["total"] == 3
    for bad in ("0", "1001", "x"):
        code, body, _ = await crossbar.call("GET", f"/api/routes?limit={bad}")
        assert code == 400 and body["error"]["message"].startswith("limit:"), bad
    assert (alpha["hosts"], alpha["leases"], alpha["leases_by_host"]) == (
        ["atlas"],
        1,
        {"atlas": 1},
    )
    assert routes[0]["template"] is None and routes[0]["leases"] == 1
    assert routes[1]["leases"] == 0 and routes[1]["requests"] == 0
    assert "keys" not in routes[0]
    assert (alpha["fallbacks"], alpha["fallback_after"]) == (["solo"], 30.0)
    assert (routes[0]["fallbacks"], routes[0]["fallback_after"]) == ([], None)


@pytest_twisted.ensureDeferred
async def test_hosts_show_health_draining_and_slots_per_model(crossbar):
    await crossbar.chat("solo", conversation("a"))
    hosts = (await crossbar.get("/api/hosts"))["hosts"]
    assert [h["name"] for h in hosts] == ["titan", "atlas"]
    titan = hosts[0]
    assert (titan["healthy"], titan["draining"], titan["pinned_routes"]) == (True, False, [])
    assert "reason" in titan and "api_key" not in titan
    (model,) = titan["models"]
    keys = ("name", "parallel", "share", "in_flight", "queued", "free", "leases")
    assert {k: model[k] for k in keys} == {
        "name": MODEL,
        "parallel": 2,
        "share": 2,  # no other instance shares the store: this one has every slot
        "in_flight": 0,
        "queued": 0,
        "free": 2,
        "leases": 1,
    }
    assert model["ctx"] is not None


@pytest_twisted.ensureDeferred
async def test_drain_and_undrain_a_host_and_404_for_a_host_not_configured(crossbar):
    code, body, _ = await crossbar.call("POST", "/api/hosts/atlas/drain")
    assert (code, body) == (200, {"host": "atlas", "draining": True})
    assert crossbar.parts.hosts.draining("atlas")
    assert [h["draining"] for h in (await crossbar.get("/api/hosts"))["hosts"]] == [False, True]
    code, body, _ = await crossbar.call("DELETE", "/api/hosts/atlas/drain")
    assert (code, body) == (200, {"host": "atlas", "draining": False})
    code, body, _ = await crossbar.call("POST", "/api/hosts/orion/drain")
    assert code == 404 and body["error"]["message"] == "no host named 'orion' in the config"


@pytest_twisted.ensureDeferred
async def test_a_drain_grace_and_an_evacuation_now_are_read_from_the_body_or_the_query(crossbar):
    code, body, _ = await crossbar.call("POST", "/api/hosts/atlas/drain", {"grace": "30s"})
    assert (code, body) == (
        200,
        {"host": "atlas", "draining": True, "grace": 30.0, "stopped": 0, "streaming": 0},
    )
    ends = {h["name"]: h["drain_grace_ends"] for h in (await crossbar.get("/api/hosts"))["hosts"]}
    assert ends["titan"] is None and ends["atlas"] == pytest.approx(
        crossbar.parts.clock.seconds() + 30, abs=5
    )
    code, body, _ = await crossbar.call("DELETE", "/api/hosts/atlas/drain")
    assert crossbar.parts.handoff.evacuator.grace_ends("atlas") is None  # undrained: forgotten
    code, body, _ = await crossbar.call("POST", "/api/hosts/atlas/drain?grace=1.5")
    assert (code, body["grace"]) == (200, 1.5)
    await crossbar.call("DELETE", "/api/hosts/atlas/drain")
    refused = [
        ("/api/hosts/atlas/drain", {"grace": "soon"}, 'grace: "soon" is not a duration'),
        ("/api/hosts/atlas/drain", {"grace": -1}, "grace: must be a duration of 0 or more"),
        ("/api/hosts/atlas/drain", {"grace": True}, 'grace: give a duration such as "30s"'),
        ("/api/hosts/atlas/drain", b"[1]", "the body must be a JSON object, not list"),
        ("/api/hosts/atlas/evacuate", {"now": "yes"}, 'now: give true or false, not "yes"'),
        ("/api/hosts/atlas/evacuate?now=maybe", None, "now: give 1 or 0 (true or false)"),
    ]
    for path, sent, message in refused:
        code, body, _ = await crossbar.call("POST", path, sent)
        assert code == 400, (path, sent)
        assert body["error"]["message"].startswith(message), body
    assert not crossbar.parts.hosts.draining("atlas")  # nothing refused changed anything
    code, body, _ = await crossbar.call("POST", "/api/hosts/atlas/evacuate?now=1")
    assert code == 200
    assert (body["evacuation"]["now"], body["evacuation"]["stopped"]) == (True, 0)


@pytest_twisted.ensureDeferred
async def test_events_are_newest_first_and_filtered_by_route_since_and_limit(crossbar):
    await crossbar.chat("convo", conversation("a"))
    await crossbar.chat("solo", conversation("b"))
    await crossbar.call("DELETE", "/api/routes/solo/leases")
    events = (await crossbar.get("/api/events"))["events"]
    assert [(e["reason"], e["route"]) for e in events] == [
        ("release", "solo"),
        ("new", "solo"),
        ("new", "convo"),
    ]
    assert set(events[0]) == {"at", "route", "fp", "model", "from_host", "to_host", "reason"}
    assert len((await crossbar.get("/api/events?limit=1"))["events"]) == 1
    assert (await crossbar.get("/api/events?since=1h&route=convo"))["events"][0]["route"] == "convo"
    future = crossbar.parts.clock.seconds() + 60
    assert (await crossbar.get(f"/api/events?since={future}"))["events"] == []
    for query in ("limit=0", "limit=many", "limit=5000", "since=yesterday"):
        code, body, _ = await crossbar.call("GET", f"/api/events?{query}")
        assert code == 400 and body["error"]["type"] == "invalid_request_error", query


@pytest_twisted.ensureDeferred
async def test_usage_totals_by_route_host_and_model_with_the_cache_hit_ratio(crossbar):
    history = conversation("a")
    _, reply = await crossbar.chat("solo", history)
    await crossbar.chat("solo", turn(history, reply, "and now the tests"))
    by_route = (await crossbar.get("/api/usage?by=route&since=1h"))["usage"]
    (solo,) = by_route
    assert solo["route"] == "solo" and solo["requests"] == 2 and solo["errors"] == 0
    assert solo["prompt_tokens"] > solo["cached_tokens"] > 0 and solo["completion_tokens"] > 0
    assert solo["cache_hit_ratio"] == solo["cached_tokens"] / solo["prompt_tokens"]
    assert solo["ttfb_p50_ms"] is not None and solo["ttfb_p95_ms"] >= solo["ttfb_p50_ms"]
    assert [r["host"] for r in (await crossbar.get("/api/usage?by=host"))["usage"]] == ["titan"]
    assert [r["model"] for r in (await crossbar.get("/api/usage?by=model"))["usage"]] == [MODEL]
    code, body, _ = await crossbar.call("GET", "/api/usage?by=fp")
    assert code == 400 and "must be one of route, host, model, key" in body["error"]["message"]


@pytest_twisted.ensureDeferred
async def test_the_usage_series_buckets_tokens_per_route_for_the_chart(crossbar):
    await crossbar.chat("solo", conversation("a"))
    await crossbar.chat("convo", conversation("b"))
    answer = await crossbar.get("/api/usage/series?since=10m&bucket=1m")
    assert answer["bucket"] == 60
    assert sorted(p["route"] for p in answer["series"]) == ["convo", "solo"]
    assert all(p["at"] % 60 == 0 and p["completion_tokens"] > 0 for p in answer["series"])
    for query in ("bucket=0", "bucket=soon", "since=30d&bucket=1s", "bucket=nan", "bucket=inf"):
        code, body, _ = await crossbar.call("GET", f"/api/usage/series?{query}")
        assert code == 400 and body["error"]["message"].startswith("bucket:"), query
    for query in ("since=nan", "since=-inf"):
        code, body, _ = await crossbar.call("GET", f"/api/usage/series?{query}")
        assert code == 400 and body["error"]["message"].startswith("since:"), query


@pytest_twisted.ensureDeferred
async def test_unknown_paths_and_methods_get_json_errors(crossbar):
    code, body, _ = await crossbar.call("GET", "/api/nothing")
    assert code == 404 and body["error"] == {
        "code": 404,
        "type": "not_found_error",
        "message": "the admin API has no /api/nothing",
    }
    code, body, response = await crossbar.call("POST", "/api/leases")
    assert code == 405 and body["error"]["message"] == "POST is not allowed here"
    assert "GET" in response.headers.getRawHeaders("Allow")[0]
    code, body, _ = await crossbar.call("DELETE", "/api/routes/ghost/leases")
    assert code == 404 and body["error"]["type"] == "not_found_error"
    # A name a template serves is a route even with nothing to release.
    code, body, _ = await crossbar.call("DELETE", "/api/routes/proj-idle/leases")
    assert (code, body) == (200, {"route": "proj-idle", "released": 0})


@pytest_twisted.ensureDeferred
async def test_a_failure_inside_crossbar_is_a_500_body_without_a_traceback(crossbar, monkeypatch):
    async def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(crossbar.parts.store, "usage_totals", broken)
    code, body, _ = await crossbar.call("GET", "/api/usage")
    assert (code, body) == (
        500,
        {
            "error": {
                "code": 500,
                "type": "api_error",
                "message": "the admin API failed on this request; see the log",
            }
        },
    )


def admin_get_paths() -> list[str]:
    """Every GET path of the admin API, its variables filled with names this config has."""
    filled = {"host": "titan", "route": "convo", "name": "nobody", "model": MODEL}
    paths = set()
    for rule in Admin.app.url_map.iter_rules():
        if "GET" not in (rule.methods or ()) or not rule.rule.startswith("/api/"):
            continue
        path = rule.rule
        for var in rule.arguments:
            for form in (f"<{var}>", f"<path:{var}>", f"<string:{var}>", f"<int:{var}>"):
                path = path.replace(form, filled.get(var, "x"))
        paths.add(path)
    return sorted(paths)


def refuse_constant(constant: str) -> None:
    raise ValueError(f"not strict JSON: {constant}")


@pytest_twisted.ensureDeferred
async def test_every_admin_answer_is_strict_json_even_where_a_number_is_not_finite(crossbar):
    # Round 5: a host's subnormal times made a learned rate infinite, and /api/hosts answered
    # `Infinity`, which the dashboard's JSON.parse (and every strict parser) refuses.
    await crossbar.chat("convo", conversation("a"))
    crossbar.parts.limiter.rates._prefill[("titan", MODEL)] = _Rate(tokens=1.0, seconds=1e-320)
    paths = admin_get_paths()
    assert {"/api/hosts", "/api/status", "/api/usage"} <= set(paths)
    for path in paths:
        response = await wait(crossbar.http().get(crossbar.admin_url + path))
        text = (await wait(response.content())).decode()
        assert response.code < 500, (path, text)
        json.loads(text, parse_constant=refuse_constant)  # raises on Infinity and NaN
    hosts = (await crossbar.get("/api/hosts"))["hosts"]
    titan = next(h for h in hosts if h["name"] == "titan")
    assert "Infinity" not in json.dumps(titan)
