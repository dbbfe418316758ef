"""What the smoke run requires of crossbar; each check returns the problems it found, in words."""

from __future__ import annotations

from collections import defaultdict

from crossbar.demo.chat import Turn, call
from crossbar.demo.plan import Plan

UNKNOWN_ROUTE = "no-such-route"


def check_turns(turns: list[Turn]) -> list[str]:
    """Stickiness and caching: one host per conversation, different hosts for the two, a new
    lease at turn 1 and the same lease after, cached prompt tokens from turn 2 on."""
    problems = []
    by_conversation: dict[str, list[Turn]] = defaultdict(list)
    for turn in turns:
        by_conversation[turn.conversation].append(turn)
    homes = {}
    for label, its in by_conversation.items():
        hosts = [t.host for t in its]
        if len(set(hosts)) != 1:
            problems.append(f"conversation {label} moved between hosts: {' -> '.join(hosts)}")
        homes[label] = hosts[0]
        leases = [t.lease for t in its]
        if leases[0] != "new" or any(lease != "reused" for lease in leases[1:]):
            problems.append(
                f"conversation {label}: X-Crossbar-Lease was {', '.join(leases)}; "
                "expected new, then reused"
            )
        for t in its[1:]:
            if t.cached <= 0:
                problems.append(
                    f"conversation {label} turn {t.number}: no cached prompt tokens "
                    f"(prompt {t.prompt}) although its host served turn {t.number - 1}"
                )
    if len(homes) > 1 and len(set(homes.values())) != len(homes):
        problems.append(
            "the conversations share a host although another was free: "
            + ", ".join(f"{label} on {host}" for label, host in homes.items())
        )
    return problems


def check_endpoints(plan: Plan) -> list[str]:
    """What crossbar answers itself: the route's models, a template route, an unknown route."""
    problems = []
    models = call("GET", plan.route_url("/v1/models"))
    data = models.json()
    ids = [m.get("id") for m in data.get("data", [])] if isinstance(data, dict) else []
    if models.status != 200 or plan.model not in ids:
        problems.append(
            f"GET /r/{plan.route}/v1/models: HTTP {models.status}, models {ids}; "
            f"expected 200 listing {plan.model!r}"
        )
    if plan.template_route:
        served = call("GET", plan.route_url("/v1/models", plan.template_route))
        if served.status != 200:
            problems.append(
                f"GET /r/{plan.template_route}/v1/models (a template route): "
                f"HTTP {served.status}; expected 200"
            )
    unknown = call("GET", plan.route_url("/v1/models", UNKNOWN_ROUTE))
    body = unknown.json()
    error = body.get("error") if isinstance(body, dict) else None
    if (
        unknown.status != 404
        or not isinstance(error, dict)
        or error.get("type") != "not_found_error"
        or not error.get("message")
    ):
        problems.append(
            f"GET /r/{UNKNOWN_ROUTE}/v1/models: HTTP {unknown.status} "
            f"{unknown.body.decode(errors='replace')[:200]}; expected 404 with an OpenAI error "
            'body {"error": {"type": "not_found_error", "message": ...}}'
        )
    return problems
