"""The slot step of the request path (docs/architecture.md, "A request, step by step"): what an
inference request asks of its host in tokens (its `Work`), its slot on a queueing route or its
count on a `queue = false` one, and for a turn that has to wait, the valve (valve.py), which may
move it to a host where it starts sooner. Control calls take neither a slot nor a queue place.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime

from crossbar.leases import Acquired
from crossbar.limiter import Limiter, LimiterError, QueueFull, Release, Work
from crossbar.proxy import pace, traced
from crossbar.proxy.call import Call
from crossbar.proxy.classes import BATCH_RANK, rank
from crossbar.proxy.fallback import QUEUE_FULL, WAITED, cannot_serve, may_fall_back
from crossbar.proxy.placement import Placement
from crossbar.proxy.refusals import Where, for_exception
from crossbar.proxy.valve import Placed, Turn, Valve
from crossbar.tenants import ClientKey, Tenants
from crossbar.wire import Exchange, Kind, unavailable


def _noop() -> None:
    pass


class SlotStep:
    """Takes each request's slot; `take` is the step."""

    def __init__(
        self,
        clock: IReactorTime,
        limiter: Limiter,
        placement: Placement,
        tenants: Tenants | None = None,
        valve: Valve | None = None,
    ) -> None:
        """`valve`: moves queued turns where they start sooner (None: every turn waits at
        home)."""
        self._clock = clock
        self._limiter = limiter
        self._placement = placement
        self._tenants = tenants
        self._valve = valve

    async def take(
        self,
        call: Call,
        acquired: Acquired,
        ex: Exchange,
        key: ClientKey | None,
        exact: int | None,
        where: Callable[[str], Where],
        judged: bool = False,
        first: bool = False,
    ) -> tuple[Release, str, Work | None]:
        """A slot for `call` on its host, or on the host the valve moves it to (not when the
        valve has `judged` this turn already): the release, the host, and the work it brings
        there. `exact`: the guard's count of the prompt, if it made one; `where` says where a
        refusal happened. Raises the limiter's refusals in the caller's terms (a full queue as
        fallback.CannotServe where a fallback route may take the request, and so a wait past
        the route's `fallback_after`), and the valve's Replace when it found the lease gone
        elsewhere."""
        host = acquired.host
        if call.kind is not Kind.INFERENCE:
            return _noop, host, None  # control calls take neither a slot nor a queue place
        limiter, placement = self._limiter, self._placement
        prompt = exact if exact is not None else call.need
        warm = placement.expected_cached(call, acquired)
        output, informed = self._expected_output(call, key)
        prefill = prompt - pace.held_on(placement.warmth, host, call, prompt, warm)
        work = Work(prefill, output, informed=informed)
        if rank(ex.request_class) == BATCH_RANK:
            work.yield_after = call.route.batch_yield_after
        if not call.route.queues():
            return limiter.track(host, call.model, call.route.limits, work), host, work
        waited = self._clock.seconds()
        gave_way: list[bool] = []  # the wait passed fallback_after and was given up
        timer = None
        try:
            tenant = None if key is None else (key.name, key.limits.weight or 1.0)
            klass = rank(ex.request_class)
            pending = limiter.acquire(
                host, call.model, call.route.limits, tenant, work, klass=klass, first=first
            )
            valve = self._valve
            # A batch request waits at home: no bulk item ever moves a conversation's lease.
            batch = klass == BATCH_RANK
            if (
                pending.called
                or judged
                or batch
                or valve is None
                or not valve.eligible(call, acquired)
            ):
                slot: Deferred[Placed] = pending.addCallback(Placed, host)
            else:
                turn = Turn(call, host, work, prompt, warm, tenant, waited, klass)
                slot = Deferred.fromCoroutine(valve.wait(turn, pending))
            after = call.route.fallback_after
            if after is not None and not slot.called and may_fall_back(call, acquired.pinned):

                def give_way() -> None:
                    gave_way.append(True)
                    slot.cancel()  # its place in the queue is given back

                timer = self._clock.callLater(after, give_way)
            if ex.trace is None:
                placed = await slot
            else:
                placed = await traced.queue(ex.trace, slot, limiter, call, host, self._clock)
        except LimiterError as e:
            error = for_exception(e, where(host))
            if isinstance(e, QueueFull):
                raise cannot_serve(call, acquired.pinned, QUEUE_FULL, error) from None
            raise error from None
        except CancelledError:
            if not gave_way:
                raise  # the client left
            error = unavailable(
                f"no slot on route {call.route.name!r} within its fallback_after, and no "
                "fallback route could take the request; try again shortly",
                retry_after=5,
            )
            raise cannot_serve(call, acquired.pinned, WAITED, error) from None
        finally:
            if timer is not None and timer.active():
                timer.cancel()
            ex.queue_ms += (self._clock.seconds() - waited) * 1000
        verdict = placed.verdict
        if verdict is not None:
            ex.host = placed.host
            ex.lease = "moved" if acquired.reused else "new"
            if ex.trace is not None:
                traced.valve_moved(ex.trace, call, host, verdict)
        return placed.release, placed.host, work

    def _expected_output(self, call: Call, key: ClientKey | None) -> tuple[int, bool]:
        mean = None
        if key is not None and self._tenants is not None:
            mean = self._tenants.meter.mean_completion(key.name)
        return pace.expected_output(call, self._limiter.rates, mean)
