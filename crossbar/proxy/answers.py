"""What crossbar answers itself, without a host: a route's models and its health."""

from __future__ import annotations

import json
from typing import Any

from crossbar.config import Route
from crossbar.hosts import Hosts
from crossbar.wire import unavailable


def models_list(models: list[str], aliases: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """The route's models in OpenAI's list format, then its aliases (`"kind": "alias"`, and
    the model each means in `alias_of`; a glob alias keeps its glob as its id)."""
    data = [
        {"id": m, "object": "model", "created": 0, "owned_by": "crossbar", "kind": "model"}
        for m in models
    ]
    for glob, model in aliases:
        data.append(
            {
                "id": glob,
                "object": "model",
                "created": 0,
                "owned_by": "crossbar",
                "kind": "alias",
                "alias_of": model,
            }
        )
    return {"object": "list", "data": data}


def route_health(route: Route, hosts: Hosts) -> dict[str, Any]:
    """`GET /health` of a route: ok with its healthy hosts, or 503 when it has none."""
    healthy = [h for h in route.hosts if hosts.healthy(h)]
    if not healthy:
        raise unavailable(f"no host of route {route.name!r} is healthy", retry_after=5)
    return {"status": "ok", "healthy_hosts": healthy}


def answer_json(request: Any, obj: Any) -> int:
    """Answer 200 with `obj` as JSON; returns the status."""
    body = json.dumps(obj).encode()
    request.setResponseCode(200)
    request.responseHeaders.setRawHeaders(b"content-type", [b"application/json"])
    request.responseHeaders.setRawHeaders(b"content-length", [str(len(body)).encode()])
    request.write(body)
    request.finish()
    return 200
