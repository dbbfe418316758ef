"""The client's answer to a domain error: a lease, slot or upstream failure in HTTP's terms,
where the request path meets HTTP (wire/errors.py holds the answers' shapes)."""

from __future__ import annotations

import math

from attrs import frozen

from crossbar.leases import NoHost, PinnedDown
from crossbar.limiter import QueueFull, QueueTimeout, RouteQueueFull
from crossbar.tenants import KeyRefused, OverLimit
from crossbar.wire import INTERNAL, ClientError, UpstreamFailure, unavailable


@frozen
class Where:
    """What a domain error is about, for its message and its Retry-After."""

    route: str
    model: str
    host: str = ""
    retry_after: float = 5.0  # a hint for errors that pass when health changes
    queued: int = 0  # waiters for the host's slots, for a full queue's message


def for_key(error: KeyRefused | OverLimit) -> ClientError:
    """The client's answer to a key refused (401, 403) or over a limit (429), with the codes
    OpenAI's SDKs know (Anthropic's shape takes the type: authentication_error,
    permission_error, rate_limit_error)."""
    if isinstance(error, OverLimit):
        return ClientError(
            429,
            "rate_limit_error",
            error.message,
            code="rate_limit_exceeded",
            # Rounded up: a client that waits what it is told finds the request fits.
            headers={"Retry-After": str(max(1, math.ceil(error.retry_after)))},
        )
    if error.status == 403:
        return ClientError(403, "permission_error", error.message, code="permission_error")
    return ClientError(
        401,
        "authentication_error",
        error.message,
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def for_exception(error: Exception, where: Where) -> ClientError:
    """The client's answer to a lease, limiter or upstream error (anything else: INTERNAL)."""
    if isinstance(error, UpstreamFailure):
        host = where.host
        if error.reason == "idle timeout":
            return ClientError(504, "api_error", f"host {host} sent nothing in time; try again")
        if error.reason == "refused":
            return unavailable(
                f"host {host} refused the connection and no other host could take the request",
                retry_after=5,
                status=502,
            )
        if error.reason == "no local resources":
            return unavailable(
                f"crossbar cannot open a connection to host {host} now ({error.detail}); "
                "try again shortly",
                5,
            )
        if error.reason == "not http":
            return ClientError(
                502,
                "api_error",
                f"host {host} answered something that is not HTTP ({error.detail})",
                code="bad_gateway",
            )
        if error.reason == "reset":
            return ClientError(
                502,
                "api_error",
                f"host {host} closed the connection before answering; the request was not "
                "sent to another host (it may be what broke the connection)",
                headers={"Retry-After": "5"},
            )
        if error.reason == "connections busy":
            return unavailable(
                f"every connection crossbar may open to host {host} is busy and none came free "
                "in time; try again shortly",
                5,
            )
        return unavailable(f"host {host} failed ({error.reason}); try again shortly", 5)
    if isinstance(error, PinnedDown):
        return unavailable(
            f"route {where.route!r} is pinned to host {error.host!r}, which is down; "
            "ask the operator to unpin or wait for it",
            retry_after=where.retry_after,
        )
    if isinstance(error, NoHost):
        return unavailable(
            f"no healthy host can take model {where.model!r} on route {where.route!r} now",
            retry_after=where.retry_after,
        )
    if isinstance(error, RouteQueueFull):
        return ClientError(
            429,
            "rate_limit_error",
            f"route {error.route!r} already has {error.bound} requests waiting for "
            f"{where.model!r} on host {where.host} (its max_queued); retry later",
            headers={"Retry-After": str(max(1, round(error.retry_after)))},
        )
    if isinstance(error, QueueFull):
        return ClientError(
            429,
            "rate_limit_error",
            f"host {where.host} has {where.queued} requests waiting for {where.model!r}; "
            "retry later",
            headers={"Retry-After": str(max(1, round(error.retry_after)))},
        )
    if isinstance(error, QueueTimeout):
        return unavailable(
            f"waited too long for a free slot on host {where.host}; retry later",
            error.retry_after,
        )
    return INTERNAL
