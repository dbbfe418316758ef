"""From a client request to its route, its client key check and its model
(docs/reference.md, "The request path")."""

from __future__ import annotations

import hmac
import re
from typing import Any
from urllib.parse import parse_qs

from crossbar.config import Config, Route
from crossbar.wire import ClientError, bad_request, bearer, not_found

_ROUTE_PREFIX = re.compile(r"/r/([^/]+)(/.*)?")


def split_route(config: Config, raw_path: str, header: str | None) -> tuple[str, str]:
    """The route name and the llama-server path, from `/r/<route>/<path>`, else the
    `X-Crossbar-Route` header, else `default_route`; 404 when none names a route."""
    match = _ROUTE_PREFIX.fullmatch(raw_path)
    if match is not None:
        return match.group(1), match.group(2) or "/"
    name = header.strip() if header else config.server.default_route
    if not name:
        raise not_found(
            f"no route in {raw_path!r}: use http://<crossbar>/r/<route>{raw_path}, "
            "or the X-Crossbar-Route header"
        )
    return name, raw_path


def resolve_route(config: Config, name: str) -> Route:
    """The route `name` (concrete or from a template); 404 when nothing serves it."""
    route = config.route(name)
    if route is None:
        raise not_found(f"unknown route {name!r}: check the name in your base URL")
    return route


def check_key(route: Route, authorization: str | None, api_key: str | None = None) -> None:
    """A route with `keys` needs `Authorization: Bearer <one of them>` (constant-time compare);
    the `x-api-key` header that Anthropic's SDKs send is taken too."""
    if not route.keys:
        return
    token = bearer(authorization)
    if token is None and api_key:
        token = api_key.strip()
    given = (token or "").encode()
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


def choose_model(route: Route, served: list[str], body: Any, query: str) -> str:
    """The model a request is for, among `served` (the models the route's hosts serve now).

    The name is `body["model"]`, else `?model=`, else the route's default, else its only
    model. A name the route serves is that model; else the first of the route's `aliases`
    whose glob matches it names the model; else `unknown_model = "default"` serves the
    route's default model, and `"error"` answers 404 model_not_found."""
    model = body.get("model") if isinstance(body, dict) else None
    if model is not None and not isinstance(model, str):
        raise bad_request('"model" must be a string')
    if not model:
        model = (parse_qs(query).get("model") or [""])[0]
    if not model:
        if route.default_model:
            return _served(route, served, route.default_model, "the route's default model is")
        if len(served) == 1:
            return served[0]
        raise bad_request(
            f"name a model: route {route.name!r} serves {_names(served)} and has no default"
        )
    if model in served:
        return model
    target = route.alias(model)
    if target is not None:
        return _served(route, served, target, f"{model!r} is an alias of")
    if route.unknown_model == "default" and route.default_model:
        return _served(route, served, route.default_model, "the route's default model is")
    raise not_found(
        f"model {model!r} is not served on route {route.name!r}: use one of {_names(served)}"
        + (f", or a name matching its aliases ({_globs(route)})" if route.aliases else ""),
        code="model_not_found",
    )


def _served(route: Route, served: list[str], model: str, because: str) -> str:
    if model in served:
        return model
    raise not_found(
        f"{because} model {model!r}, which no host of route {route.name!r} serves now "
        f"(it serves {_names(served)}); tell the operator",
        code="model_not_found",
    )


def _names(models: list[str]) -> str:
    return ", ".join(models) if models else "no model"


def _globs(route: Route) -> str:
    return ", ".join(glob for glob, _ in route.aliases)
