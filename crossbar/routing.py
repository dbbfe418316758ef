"""From a client request to a route, a request kind, a model and the upstream path (SPEC §4)."""

from __future__ import annotations

import enum
import hmac
import json
import re
from typing import Any
from urllib.parse import parse_qs

from attrs import frozen

from crossbar.config import Config
from crossbar.errors import ClientError, bad_request, not_found
from crossbar.route import Route

INFERENCE_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/completion",
        "/completions",
        "/infill",
        "/v1/embeddings",
        "/embedding",
        "/embeddings",
        "/v1/rerank",
        "/reranking",
        "/v1/responses",
        "/v1/messages",
    }
)
CONTROL_PATHS = frozenset(
    {
        "/v1/chat/completions/control",
        "/slots",
        "/props",
        "/tokenize",
        "/detokenize",
        "/apply-template",
        "/lora-adapters",
        "/metrics",
        "/v1/chat/completions/input_tokens",
        "/v1/responses/input_tokens",
        "/v1/messages/count_tokens",
    }
)
_SLOT = re.compile(r"/slots/\d+")
_ROUTE_PREFIX = re.compile(r"/r/([^/]+)(/.*)?")


class Kind(enum.Enum):
    """What crossbar does with a request."""

    INFERENCE = "inference"
    CONTROL = "control"
    MODELS = "models"
    HEALTH = "health"


def kind_of(method: str, path: str) -> Kind | None:
    """The kind of a llama-server path, or None for a path crossbar does not serve."""
    if path in INFERENCE_PATHS:
        return Kind.INFERENCE
    if path in CONTROL_PATHS or _SLOT.fullmatch(path):
        return Kind.CONTROL
    if method == "GET" and path in ("/v1/models", "/models"):
        return Kind.MODELS
    if method == "GET" and path == "/health":
        return Kind.HEALTH
    return None


@frozen
class Target:
    """Where a request goes: the route, and the llama-server path and query."""

    route: Route
    path: str
    query: str


def split_route(config: Config, raw_path: str, query: str, header: str | None) -> Target:
    """Find the route from `/r/<route>/`, `X-Crossbar-Route` or `default_route`."""
    name: str | None = None
    path = raw_path
    match = _ROUTE_PREFIX.fullmatch(raw_path)
    if match is not None:
        name, path = match.group(1), match.group(2) or "/"
    elif header:
        name = header.strip()
    elif config.server.default_route:
        name = config.server.default_route
    if name is None:
        raise not_found(
            f"no route in {raw_path!r}: use http://<crossbar>/r/<route>{raw_path}, "
            "or the X-Crossbar-Route header"
        )
    route = config.route(name)
    if route is None:
        raise not_found(f"unknown route {name!r}: check the name in your base URL")
    return Target(route, path, query)


def check_key(route: Route, authorization: str | None, api_key: str | None = None) -> None:
    """A route with `keys` needs `Authorization: Bearer <one of them>` (constant-time compare);
    the `x-api-key` header that Anthropic's SDKs send is taken too."""
    if not route.keys:
        return
    given = b""
    if authorization and authorization[:7].lower() == "bearer ":
        given = authorization[7:].strip().encode()
    elif api_key:
        given = api_key.strip().encode()
    found = False
    for key in route.keys:
        # Compare against every key so the time taken says nothing about which one matched.
        found |= hmac.compare_digest(given, key.encode())
    if not found:
        raise ClientError(
            401,
            "authentication_error",
            f"route {route.name!r} needs an API key: send Authorization: Bearer <key>",
        )


def parse_body(kind: Kind, method: str, path: str, raw: bytes) -> Any:
    """The JSON body: an object for inference; JSON (or empty) for control POSTs."""
    if method != "POST" and not raw:
        return None
    if not raw.strip():
        if kind is Kind.INFERENCE:
            raise bad_request("the request body is empty: send a JSON object")
        return None
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    # llama-server's POST /lora-adapters takes a JSON array; everything else an object.
    if not isinstance(body, dict) and not (path == "/lora-adapters" and isinstance(body, list)):
        raise bad_request(f"the request body must be a JSON object, not {type(body).__name__}")
    return body


def choose_model(config: Config, route: Route, body: Any, query: str) -> str:
    """`body["model"]`, else `?model=`, else the route's default, else its only model."""
    model = body.get("model") if isinstance(body, dict) else None
    if model is not None and not isinstance(model, str):
        raise bad_request('"model" must be a string')
    if not model:
        model = (parse_qs(query).get("model") or [""])[0]
    if not model:
        model = route.default_model
    models = config.models_of(route)
    if not model:
        if len(models) == 1:
            return models[0]
        raise bad_request(
            f"name a model: route {route.name!r} serves {', '.join(models)} and has no default"
        )
    if model not in models:
        raise not_found(
            f"model {model!r} is not served on route {route.name!r} (it serves "
            f"{', '.join(models)})",
            code="model_not_found",
        )
    return model
