"""Which request class an inference request runs at (config/classes.py; docs/reference.md,
"Slots": classes): what it says of itself, else what its client's own hints say, else its
key's class, else its route's; never above its key's `max_class`."""

from __future__ import annotations

from typing import Any

from crossbar.config import (
    CLIENT_HINTS,
    HEADER,
    RANK,
    SERVICE_TIERS,
    Route,
    class_error,
    lowered,
)
from crossbar.tenants import ClientKey
from crossbar.wire import RawHeaders, bad_request

_HEADER = HEADER.encode()
_HINTS = tuple((name.encode(), values) for name, values in CLIENT_HINTS.items())


def claimed(headers: RawHeaders, body: Any) -> str | None:
    """The class a request claims for itself: `X-Crossbar-Class` (a value that is no class is
    a 400), else its body's `service_tier`, else a known client's hint; None when it says
    nothing."""
    said = headers.getRawHeaders(_HEADER)
    if said:
        value = said[-1].decode("latin-1").strip().lower()
        why = class_error(value)
        if why is not None:
            raise bad_request(f"X-Crossbar-Class {why}")
        return value
    tier = body.get("service_tier") if isinstance(body, dict) else None
    if isinstance(tier, str) and SERVICE_TIERS.get(tier) is not None:
        return SERVICE_TIERS[tier]
    for name, values in _HINTS:
        hint = headers.getRawHeaders(name)
        if hint:
            found = values.get(hint[-1].decode("latin-1").strip().lower())
            if found is not None:
                return found
    return None


def request_class(headers: RawHeaders, body: Any, route: Route, key: ClientKey | None) -> str:
    """The class `body` with `headers` runs at on `route` for `key` (module doc)."""
    limits = key.limits if key is not None else None
    found = claimed(headers, body)
    if found is None and limits is not None:
        found = limits.request_class
    if found is None:
        found = route.request_class
    return found if limits is None else lowered(found, limits.max_class)


BATCH_RANK = RANK["batch"]


def rank(name: str) -> int:
    """A class's rank in the limiter (batch 0, standard 1, interactive 2)."""
    return RANK.get(name, RANK["standard"])
