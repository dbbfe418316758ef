"""Falling back to another route when a request's own cannot serve it before its first byte
(a route's `fallbacks`; docs/operator-guide.md, "Fallbacks").

The steps that can find a route unable to serve raise `CannotServe` (through `cannot_serve`)
instead of their error, where a fallback may take the request: an inference request, not over
a pin (a pin is the operator's word and outranks everything, health included), of a route with
fallbacks or on a fallback route itself (which then lets its caller try the next one; its own
fallbacks are never followed). The resource tries the fallbacks in order; when none serves,
the client gets the first error, as it would have without fallbacks.
"""

from __future__ import annotations

import json
from typing import Any

from attrs import evolve

from crossbar.config import Route
from crossbar.leases import Key
from crossbar.proxy.call import Call
from crossbar.proxy.routing import choose_model
from crossbar.wire import ClientError, Kind, limit_output

# Why a request fell back (the `reason` label of crossbar_fallbacks_total, the usage row's
# fallback_reason):
NO_HOST = "no_host"  # no healthy, non-draining host of the route serves the model
HOST_REFUSED = "host_refused"  # its host refused the connection (or timed out connecting)
QUEUE_FULL = "queue_full"  # its queue refused it (queue_max, max_queued)
WAITED = "waited"  # its wait for a slot passed the route's fallback_after
HOST_BUSY = "host_busy"  # its host answered 429 or 503 before any byte
REASONS = (NO_HOST, HOST_REFUSED, QUEUE_FULL, WAITED, HOST_BUSY)


class CannotServe(Exception):
    """The request's route cannot serve it, for `reason`; `error` is what its client gets
    when no fallback route does."""

    def __init__(self, reason: str, error: ClientError) -> None:
        super().__init__(f"{reason}: {error}")
        self.reason = reason
        self.error = error


def may_fall_back(call: Call, pinned: bool = False) -> bool:
    """Whether `call` may go to a fallback route when its own cannot serve it."""
    if call.kind is not Kind.INFERENCE or pinned:
        return False
    return bool(call.route.fallbacks or call.fallback_from)


def cannot_serve(call: Call, pinned: bool, reason: str, error: ClientError) -> Exception:
    """What a step raises when `call`'s route cannot serve it: `CannotServe` where a fallback
    may take it, else `error` itself."""
    return CannotServe(reason, error) if may_fall_back(call, pinned) else error


def host_busy(host: str, status: int, retry_after: list[bytes] | None, body: bytes) -> CannotServe:
    """A host's 429 or 503 before any byte: why the request may fall back, and the error its
    client gets when none serves it (the host's status, its message, its Retry-After)."""
    headers = {"Retry-After": retry_after[-1].decode("latin-1")} if retry_after else {}
    kind = "rate_limit_error" if status == 429 else "unavailable_error"
    said = _host_message(body)
    message = f"host {host} is busy ({status}" + (f": {said})" if said else ")")
    return CannotServe(HOST_BUSY, ClientError(status, kind, message, headers=headers))


def _host_message(body: bytes) -> str:
    """What a host's error body says (its `error.message`, or the start of its text)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body[:200].decode("utf-8", "replace").strip()
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message[:200] if isinstance(message, str) else ""


def fallback_model(route: Route, served: list[str], body: Any, query: str, wanted: str) -> str:
    """The model fallback `route` is asked for: the one the client named, where the route
    serves it (its aliases included), else the model the first route resolved it to (`wanted`)
    if served here, else the route's default model (or its only one); "" when none is."""
    try:
        return choose_model(route, served, body, query)
    except ClientError:
        pass
    if wanted in served:
        return wanted
    if route.default_model in served:
        return route.default_model
    return served[0] if len(served) == 1 else ""


def fallback_call(
    call: Call, route: Route, model: str, fp: str, candidates: tuple[str, ...], need: int
) -> Call:
    """`call` as fallback `route` takes it: its model, a lease of its own for the conversation
    (`fp`), its hosts, and the route's output limits over the body."""
    inbound = call.inbound
    if route.limits_output:
        fields = call.dialect.output_fields
        limited = limit_output(inbound.body, fields, route.max_tokens_default, route.max_tokens_cap)
        if limited is not None:
            inbound = evolve(inbound, body=limited, raw=json.dumps(limited).encode())
    key = Key(route.name, "" if route.per_route() else fp, model)
    return evolve(
        call,
        route=route,
        inbound=inbound,
        model=model,
        key=key,
        candidates=candidates,
        origin=None,
        need=need,
        fallback_from=call.route.name,
    )
