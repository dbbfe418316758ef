"""The admin API's HTTP plumbing: the JSON answer of a handler, query arguments, a JSON body,
an action's options (docs/operator-guide.md, "Admin API"). The handlers: api.py."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from crossbar.config import parse_duration
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


def options_of(request: Any) -> dict[str, Any]:
    """An action's options: its body as a JSON object (none at all: no options), a 400 for
    anything else."""
    raw = request.content.read() if request.content is not None else b""
    return json_object(raw, what="the body") if raw.strip() else {}


_YES, _NO = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_SECONDS = re.compile(r"\d+(?:\.\d+)?")


def flag_option(request: Any, options: dict[str, Any], name: str) -> bool:
    """A yes-or-no option: the body's `name` (true or false), else `?name=` (1 or 0, true or
    false); False when neither says; a 400 for anything else."""
    value = options.get(name)
    if value is None:
        text = arg(request, name)
        if text is None:
            return False
        if text.lower() not in _YES + _NO:
            raise bad_request(f"{name}: give 1 or 0 (true or false), not {text!r}")
        return text.lower() in _YES
    if not isinstance(value, bool):
        raise bad_request(f"{name}: give true or false, not {json.dumps(value)}")
    return value


def duration_option(value: Any, name: str) -> float:
    """A duration option: a string such as "30s" or a number of seconds (strings of digits
    too, as a query gives them), never negative; a 400 for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise bad_request(f'{name}: give a duration such as "30s" (or seconds)')
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text) if _SECONDS.fullmatch(text) else parse_duration(text)
        except ValueError as e:
            raise bad_request(f"{name}: {e}") from None
    if not math.isfinite(value) or value < 0:
        raise bad_request(f"{name}: must be a duration of 0 or more")
    return float(value)
