"""The request path's steps with their spans, taken only when tracing is on: the lease, the
context guard's exact count and the queue wait, each a child of the request's SERVER span
(docs/operator-guide.md, "Tracing"). With tracing off the proxy never comes here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from twisted.internet.defer import CancelledError, Deferred

from crossbar.leases import Acquired
from crossbar.limiter import Limiter, LimiterError, QueueTimeout
from crossbar.proxy.call import Call
from crossbar.proxy.placement import Placement
from crossbar.proxy.valve import Verdict
from crossbar.wire import ClientError

if TYPE_CHECKING:
    from crossbar.tracing import RequestTrace

T = TypeVar("T")


def _failure(e: BaseException) -> str:
    """A step's error.type."""
    if isinstance(e, CancelledError):
        return "cancelled"
    if isinstance(e, ClientError):
        return str(e.status)
    return type(e).__name__


def _conversation(call: Call) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "crossbar.route": call.route.name,
        "gen_ai.request.model": call.model,
    }
    if call.key.fp:
        attributes["gen_ai.conversation.id"] = call.key.fp
    return attributes


async def place(
    trace: RequestTrace,
    placement: Placement,
    call: Call,
    place: Callable[[], Awaitable[Acquired]],
) -> Acquired:
    """`place()` in a `crossbar.lease` span: the decision (new, reused, pinned, moved), why,
    the host, and the host it moved from."""
    before = placement.holder(call)
    span = trace.start("crossbar.lease", _conversation(call))
    try:
        acquired = await place()
    except BaseException as e:
        trace.end(span, None, _failure(e))
        raise
    decision, why, origin = placement.explain(call, before, acquired)
    attributes = {
        "crossbar.lease": decision,
        "crossbar.lease.reason": why,
        "crossbar.host": acquired.host,
    }
    if origin:
        attributes["crossbar.lease.from"] = origin
    trace.end(span, attributes)
    return acquired


async def guard(
    trace: RequestTrace,
    check: Callable[[Callable[[], Awaitable[int | None]]], Awaitable[int | None]],
    count: Callable[[], Awaitable[int | None]],
    host: str,
    limit: int | None,
) -> int | None:
    """The context guard, with a `crossbar.guard` span when it asks the host for an exact
    count (none when an estimate was enough): the count, the limit, whether it refused.
    Returns what the guard returns (the host's exact count, when it asked)."""
    asked: list[Any] = []  # [span, count] once the guard asked

    async def counted() -> int | None:
        span = trace.start("crossbar.guard", {"crossbar.host": host})
        asked.append(span)
        try:
            tokens = await count()
        except BaseException as e:
            trace.end(span, None, _failure(e))
            asked.clear()
            raise
        asked.append(tokens)
        return tokens

    refused = False
    try:
        return await check(counted)
    except ClientError:
        refused = True
        raise
    finally:
        if len(asked) == 2:
            span, tokens = asked
            attributes: dict[str, Any] = {"crossbar.guard.refused": refused}
            if limit:
                attributes["crossbar.guard.limit"] = limit
            if tokens is not None:
                attributes["crossbar.guard.input_tokens"] = tokens
            trace.end(span, attributes)


def valve_moved(trace: RequestTrace, call: Call, home: str, verdict: Verdict) -> None:
    """A `crossbar.lease` span for the valve's move of a queued turn: moved, reason `busy`,
    from its home host, with the seconds it expected to wait at home and on the new host."""
    span = trace.start("crossbar.lease", _conversation(call))
    attributes = {
        "crossbar.lease": "moved",
        "crossbar.lease.reason": "busy",
        "crossbar.host": verdict.host,
        "crossbar.lease.from": home,
        "crossbar.valve.stay_s": round(verdict.stay, 3),
        "crossbar.valve.move_s": round(verdict.move, 3),
    }
    trace.end(span, attributes)


async def queue(
    trace: RequestTrace,
    pending: Deferred[T],
    limiter: Limiter,
    call: Call,
    host: str,
    clock: Any,
) -> T:
    """The wait for a slot in a `crossbar.queue` span: the route, the place in the queue on
    arrival (0: a slot was free) and the milliseconds waited."""
    began = clock.seconds()
    position = 0 if pending.called else limiter.queued(host, call.model)
    span = trace.start(
        "crossbar.queue",
        {
            "crossbar.route": call.route.name,
            "crossbar.host": host,
            "gen_ai.request.model": call.model,
            "crossbar.queue.position": position,
        },
    )
    error = ""
    try:
        return await pending
    except QueueTimeout:
        error = "queue_timeout"
        raise
    except LimiterError:
        error = "queue_full"
        raise
    except BaseException as e:
        error = _failure(e)
        raise
    finally:
        waited = round((clock.seconds() - began) * 1000, 3)
        trace.end(span, {"crossbar.queue.wait_ms": waited}, error)
