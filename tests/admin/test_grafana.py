"""docs/grafana/crossbar.json: every expression names only metrics (and labels) a running
crossbar with traffic exports, and the dashboard shows what the operator guide promises."""

from __future__ import annotations

import json
import pathlib
import re

import pytest_twisted
from prometheus_client.parser import text_string_to_metric_families

from tests.support.admin_harness import conversation, start_service, write_config
from tests.support.harness import start_fakes, wait

DASHBOARD = pathlib.Path(__file__).resolve().parents[2] / "docs" / "grafana" / "crossbar.json"
# PromQL's functions, aggregations and keywords the dashboard may use, and the label every
# histogram bucket has.
PROMQL = {
    "sum", "avg", "min", "max", "count", "rate", "irate", "increase", "histogram_quantile",
    "clamp_min", "clamp_max", "topk", "bottomk", "by", "without", "on", "ignoring",
    "group_left", "group_right", "bool", "and", "or", "unless", "label_values", "offset",
}  # fmt: skip


def expressions(dashboard: dict) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and template queries."""
    found = []
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            found += [t["expr"] for t in inner.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if variable["type"] == "query":
            found.append(query["query"] if isinstance(query, dict) else query)
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads."""
    expr = re.sub(r"\$\{?\w+\}?", "", expr)  # Grafana's variables
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"label_values\(([^,()]+),[^)]*\)", r"\1", expr)
    names = set(re.findall(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", expr))
    return names - PROMQL


def grouping_labels(expr: str) -> set[str]:
    """The labels an expression groups by or matches on."""
    labels = set()
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        labels |= {name.strip() for name in group.split(",") if name.strip()}
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        labels |= set(re.findall(r"(\w+)\s*[=!]~?", matchers))
    return labels


def test_the_reader_finds_every_metric_and_nothing_else():
    expr = (
        "histogram_quantile(0.95, sum by (le, route) (rate(crossbar_ttfb_seconds_bucket"
        '{route=~"$route", kind="cached"}[$__rate_interval]))) / up'
    )
    assert metric_names(expr) == {"crossbar_ttfb_seconds_bucket", "up"}
    assert grouping_labels(expr) == {"le", "route", "kind"}
    assert metric_names("label_values(crossbar_requests_total, route)") == {
        "crossbar_requests_total"
    }


@pytest_twisted.ensureDeferred
async def test_every_expression_names_a_metric_crossbar_exports_with_the_labels_it_groups_by(
    tmp_path,
):
    fakes = await start_fakes("titan", "atlas")
    routes = {"convo": {"hosts": ["titan", "atlas"]}}
    running = await start_service(write_config(tmp_path / "c.toml", fakes, routes), fakes)
    try:
        # Traffic that fills every series: requests with tokens and a first byte, one that
        # fails, a lease on each host, then a pin that moves one of them.
        for name in ("a", "b"):
            await running.chat("convo", conversation(name))
        failed = await wait(running.http().get(running.proxy_url + "/r/convo/v1/nothing"))
        assert failed.code == 404
        await wait(failed.content())
        code, _, _ = await running.call("PUT", "/api/routes/convo/pin", {"host": "atlas"})
        assert code == 200
        await running.chat("convo", conversation("a"))
        await running.chat("convo", conversation("b"))
        code, text, _ = await running.call("GET", "/metrics")
        assert code == 200
    finally:
        await running.stop()
    exported: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            exported.setdefault(sample.name, set()).update(sample.labels)
    dashboard = json.loads(DASHBOARD.read_text())
    seen = set()
    for expr in expressions(dashboard):
        names = metric_names(expr)
        assert names, expr
        unknown = names - set(exported)
        assert not unknown, f"{expr}: crossbar exports no {sorted(unknown)}"
        labels = set().union(*(exported[n] for n in names))
        assert grouping_labels(expr) <= labels, f"{expr}: {grouping_labels(expr) - labels}"
        seen |= names
    assert len(seen) >= 15  # the dashboard reads most of what crossbar exports


def test_the_dashboard_shows_what_the_operator_guide_promises():
    dashboard = json.loads(DASHBOARD.read_text())
    titles = " | ".join(p["title"] for p in dashboard["panels"])
    for shown in (
        "Cache-hit ratio per route",
        "Time to first byte",
        "Queue wait",
        "Slots in use",
        "Lease moves by reason",
        "Host health",
    ):
        assert shown in titles
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "route"}
