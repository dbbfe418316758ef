"""From a client request to its route, its client key and its model
(docs/reference.md, "The request path")."""

from __future__ import annotations

import hmac
import re
from typing import Any
from urllib.parse import parse_qs

from crossbar.config import Config, Route
from crossbar.tenants import ClientKey, KeyBook, KeyRefused
from crossbar.wire import bad_request, bearer, not_found

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


_CREDENTIALS = ((b"authorization", "Authorization"), (b"x-api-key", "x-api-key"))


def credentials(headers: Any) -> tuple[str | None, str | None]:
    """The request's `Authorization` and `x-api-key` values, each read as UTF-8 (a key's
    secret is hashed as UTF-8: config/keys.py `hash_secret`, so a secret that is not ASCII
    matches the bytes a client sends for it). A value that is not UTF-8 is "", which matches
    no key. Either header sent twice is 400: which one counts would be a guess, and a proxy
    in front could have guessed the other."""
    read: list[str | None] = []
    for raw, name in _CREDENTIALS:
        values = headers.getRawHeaders(raw)
        if not values:
            read.append(None)
        elif len(values) > 1:
            raise bad_request(f"the request has {len(values)} {name} headers: send one")
        else:
            try:
                read.append(values[0].decode("utf-8"))
            except UnicodeDecodeError:
                read.append("")
    return read[0], read[1]


def presented_key(authorization: str | None, api_key: str | None) -> str | None:
    """The client key a request carries: `Authorization: Bearer <key>` (OpenAI's SDKs), else
    `x-api-key` (Anthropic's)."""
    token = bearer(authorization)
    if token is None and api_key:
        token = api_key.strip() or None
    return token


def authenticate(
    route: Route,
    book: KeyBook | None,
    authorization: str | None,
    api_key: str | None = None,
    now: float = 0.0,
) -> ClientKey | None:
    """The named key a request brings (None: none, or one of the route's anonymous `keys`).

    A named key is found by its secret in `book`; blocked, expired or rotated past its grace,
    it is refused (401) on every route. A route that needs a key (`auth = "keys"`, or a `keys`
    list) takes a named key whose `routes` cover it (else 403) or one of its own `keys`
    (constant-time compare against every one); anything else is 401. On other routes a named
    key only names the request's usage and charges its limits."""
    token = presented_key(authorization, api_key)
    key = book.identify(token, now) if token and book is not None and len(book) else None
    if key is not None:
        if route.needs_key and not key.covers_route(route.name):
            raise KeyRefused(
                403, f"key {key.name!r} may not use route {route.name!r}: ask the operator"
            )
        return key
    if not route.needs_key:
        return None
    given = (token or "").encode()
    found = False
    for anonymous in route.keys:
        # Compare against every key so the time taken says nothing about which one matched.
        found |= hmac.compare_digest(given, anonymous.encode())
    if not found:
        raise KeyRefused(
            401, f"route {route.name!r} needs an API key: send Authorization: Bearer <key>"
        )
    return None


def authenticate_named(
    route: Route, book: KeyBook | None, name: str | None, now: float
) -> ClientKey | None:
    """The named key a request crossbar makes of itself runs as (proxy/inside.py), by the rules
    `authenticate` applies once a secret has named it: gone, blocked or expired is 401, a route
    that needs a key and is not in its scope 403. None for no key: the batch it belongs to was
    made by a client the route let in (with none, or one of its anonymous `keys`)."""
    if name is None:
        return None
    key = book.get(name) if book is not None else None
    if key is None:
        raise KeyRefused(401, f"key {name!r} no longer exists: ask the operator")
    if key.blocked:
        raise KeyRefused(401, f"key {name!r} is blocked: ask the operator")
    if key.expired(now):
        raise KeyRefused(401, f"key {name!r} has expired: ask the operator for a new one")
    if route.needs_key and not key.covers_route(route.name):
        raise KeyRefused(403, f"key {name!r} may not use route {route.name!r}: ask the operator")
    return key


def check_model_scope(key: ClientKey | None, route: Route, model: str) -> None:
    """403 when a named key may not ask for `model`."""
    if key is not None and not key.covers_model(model):
        raise KeyRefused(
            403,
            f"key {key.name!r} may not use model {model!r} (it may use "
            f"{', '.join(key.models)}); ask the operator",
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
