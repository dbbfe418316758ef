"""/metrics stays small at fleet scale: a route a template serves is labelled with its template
(unless the operator lists it in server.metrics_routes), and a reload drops the series of the
routes and hosts it removed."""

import pytest_twisted
from prometheus_client.parser import text_string_to_metric_families

from crossbar.records import UsageRow
from tests.support.admin_harness import conversation, start_service, write_config
from tests.support.harness import MODEL, host_table, start_fakes
from tests.support.routes import CONVO

ROUTES = CONVO
TEMPLATES = {"teams": {"match": "team-*", "hosts": ["titan", "atlas"], "default_model": MODEL}}


def row(route: str, host: str, status: int = 200) -> UsageRow:
    return UsageRow(1.0, route, "f", MODEL, host, "/v1/chat/completions", status, False,
                    prompt_tokens=100, cached_tokens=50, completion_tokens=10,
                    queue_ms=1.0, ttfb_ms=20.0)  # fmt: skip


def routes_of(text: str, name: str) -> set[str]:
    return {
        s.labels["route"]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


async def start(tmp_path, **server):
    fakes = await start_fakes("titan", "atlas")
    path = write_config(tmp_path / "c.toml", fakes, ROUTES, server=server, templates=TEMPLATES)
    return await start_service(path, fakes)


@pytest_twisted.ensureDeferred
async def test_a_thousand_template_routes_make_one_series_each_and_metrics_stay_small(tmp_path):
    crossbar = await start(tmp_path, metrics_routes=["team-7"])
    try:
        await crossbar.chat("team-3", conversation("a"))  # through the proxy, as any request
        metrics = crossbar.parts.metrics
        for i in range(1000):
            for host in ("titan", "atlas"):
                metrics.observe(row(f"team-{i}", host, status=(200, 429, 503)[i % 3]))
        code, text, _ = await crossbar.call("GET", "/metrics")
        assert code == 200
        assert len(text.encode()) < 200 * 1024, len(text)
        assert routes_of(text, "crossbar_requests_total") == {"template:teams", "team-7"}
        assert routes_of(text, "crossbar_cache_hit_ratio") == {"template:teams", "team-7"}
        assert routes_of(text, "crossbar_ttfb_seconds_count") == {"template:teams", "team-7"}
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_reload_drops_the_series_of_removed_routes_and_hosts(tmp_path):
    crossbar = await start(tmp_path, metrics_routes=["team-7"])
    try:
        metrics = crossbar.parts.metrics
        for route in ("convo", "team-7", "team-8"):
            for host in ("titan", "atlas"):
                metrics.observe(row(route, host))
        titan_only = {"titan": host_table(crossbar.fakes, parallel=2)["titan"]}
        write_config(crossbar.path, crossbar.fakes, {"other": {"hosts": ["titan"]}},
                     hosts=titan_only, templates={"teams": {**TEMPLATES["teams"],
                                                            "hosts": ["titan"]}})  # fmt: skip
        code, body, _ = await crossbar.call("POST", "/api/reload")
        assert code == 200, body
        _, text, _ = await crossbar.call("GET", "/metrics")
        # convo is gone, team-7 is no longer listed (folded from now on), atlas is gone.
        assert routes_of(text, "crossbar_requests_total") == {"template:teams"}
        assert routes_of(text, "crossbar_cache_hit_ratio") == {"template:teams"}
        assert 'host="atlas"' not in text.split("crossbar_slots")[0]
    finally:
        await crossbar.stop()
