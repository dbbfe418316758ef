"""The operator's client keys through the admin API (docs/operator-guide.md, "Tenants"): a new
key's body read and checked, and each action's answer. A secret is in an answer twice only:
when its key is created and when it is rotated; never in a list, a show or a log line."""

from __future__ import annotations

from typing import Any

from crossbar.admin.http import duration_option
from crossbar.config import read_key_spec
from crossbar.tenants import KeyActionRefused, Tenants, key_view
from crossbar.wire import ClientError, bad_request


def refused(error: KeyActionRefused) -> ClientError:
    """A key action refused, as the admin API answers it."""
    kinds = {404: "not_found_error", 409: "invalid_request_error"}
    return ClientError(
        error.status, kinds.get(error.status, "invalid_request_error"), error.message
    )


def grace_of(body: dict[str, Any]) -> float:
    """A rotation's `grace`: a duration string ("1h") or seconds; 0 by default."""
    return duration_option(body.get("grace", 0), "grace")


async def create(tenants: Tenants, body: dict[str, Any], now: float) -> dict[str, Any]:
    spec, errors = read_key_spec(body)
    if spec is None:
        raise bad_request("; ".join(errors))
    try:
        key, secret = await tenants.create(
            spec.name, spec.routes, spec.models, spec.limits, spec.expires
        )
    except KeyActionRefused as e:
        raise refused(e) from None
    return {
        **key_view(key, now),
        "secret": secret,
        "note": "the secret is shown this once: crossbar keeps only its hash",
    }


async def rotate(tenants: Tenants, name: str, body: dict[str, Any], now: float) -> dict[str, Any]:
    grace = grace_of(body)
    try:
        key, secret = await tenants.rotate(name, grace)
    except KeyActionRefused as e:
        raise refused(e) from None
    return {**key_view(key, now), "secret": secret, "grace": grace}
