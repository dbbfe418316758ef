"""The admin API's HTTP plumbing: the JSON answer of a handler, query arguments, a JSON body
(docs/operator-guide.md, "Admin API"). The handlers: api.py."""

from __future__ import annotations

import json
import math
from typing import Any

from crossbar.wire import bad_request, json_object, phrase

MAX_BODY = 64 * 1024  # admin requests are small JSON objects


def json_answer(request: Any, status: int, payload: Any) -> bytes:
    request.setResponseCode(status, phrase(status))
    request.setHeader(b"Content-Type", b"application/json")
    request.setHeader(b"Cache-Control", b"no-store")
    return strict_json(payload)


def strict_json(payload: Any) -> bytes:
    """`payload` as JSON every strict parser reads: a number that is not finite (a rate a
    host's numbers made infinite) is written `null`, never `Infinity` or `NaN`, which the
    dashboard's JSON.parse and most clients refuse."""
    try:
        return json.dumps(payload, allow_nan=False).encode()
    except ValueError:
        return json.dumps(_finite(payload), allow_nan=False).encode()


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def arg(request: Any, name: str) -> str | None:
    """A query argument; None when it is missing or empty (`?route=` filters nothing)."""
    values = request.args.get(name.encode())
    return values[0].decode("utf-8", "replace") or None if values else None


def limit_arg(request: Any, most: int, default: int, name: str = "limit") -> int:
    """The `limit` (or `name`) query argument: a whole number from 1 to `most`, or a 400."""
    text = arg(request, name) or str(default)
    try:
        limit = int(text)
    except ValueError:
        limit = -1
    if not 0 < limit <= most:
        raise bad_request(f"{name}: give a whole number from 1 to {most}, not {text!r}")
    return limit


def body_of(request: Any) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying what is wrong with it."""
    raw = request.content.read() if request.content is not None else b""
    return json_object(raw, what="the body")
