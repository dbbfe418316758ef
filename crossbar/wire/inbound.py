"""Reading what a client sent: its headers, a bearer token, a JSON object body."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
from attrs import frozen
from twisted.web.http_headers import Headers

from crossbar.wire.dialects import Dialect, Kind
from crossbar.wire.errors import bad_request

HeaderReader = Callable[[str], "str | None"]


@frozen
class Inbound:
    """A client's request as crossbar forwards it: method, llama-server path and query, the
    raw body and its parsed JSON (None when there is none), and the connection's facts."""

    method: str
    path: str
    query: str
    raw: bytes
    body: Any
    headers: Any  # twisted.web's Headers or RawHeaders: getRawHeaders, getAllRawHeaders
    peer: str  # the TCP peer's address
    secure: bool


def header_reader(headers: Any) -> HeaderReader:
    """`name -> str | None` over request headers (the last value, as `Request.getHeader`
    gives it, as latin-1 text)."""
    last = getattr(headers, "last", None)
    if last is not None:  # RawHeaders: a dict lookup
        return last  # type: ignore[no-any-return]

    def header(name: str) -> str | None:
        values = headers.getRawHeaders(name.encode("ascii"))
        return values[-1].decode("latin-1") if values else None

    return header


def request_headers(pairs: list[tuple[bytes, bytes]]) -> Headers:
    """A request's header lines, in order, as Headers."""
    headers = Headers()
    add = headers.addRawHeader
    for name, value in pairs:
        add(name, value)
    return headers


def bearer(value: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value, or None."""
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def json_object(raw: bytes, what: str = "the request body", allow_array: bool = False) -> Any:
    """`raw` parsed as a JSON object (or an array, where allowed), or a 400 saying what is
    wrong with it."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = _standard_json(raw, what)
    if not isinstance(value, dict) and not (allow_array and isinstance(value, list)):
        raise bad_request(f"{what} must be a JSON object, not {type(value).__name__}")
    return value


def _standard_json(raw: bytes, what: str) -> Any:
    """`raw` as the standard library reads it: what orjson refuses and json takes (NaN,
    integers past 64 bits, lone surrogates, UTF-16 bodies, deep nesting) reads as it always
    did, and what neither takes gets json's own words."""
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"{what} is not valid JSON: {e}") from None
    except RecursionError:
        raise bad_request(f"{what} is nested too deeply to be read") from None


def request_body(kind: Kind, dialect: Dialect, method: str, path: str, raw: bytes) -> Any:
    """The JSON body of a request for a host: an object for inference; JSON (an array where
    the dialect takes one) or nothing for control calls; a 400 otherwise."""
    if method != "POST" and not raw:
        return None
    if not raw.strip():
        if kind is Kind.INFERENCE:
            raise bad_request("the request body is empty: send a JSON object")
        return None
    return json_object(raw, allow_array=path in dialect.array_bodies)
