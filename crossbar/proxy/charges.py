"""What a request's named key pays (tenants/meter.py; docs/reference.md, "Keys"): its expected
cost reserved before it queues, the answer's true cost settled in its place, and what a batch
run stopped for a waiting turn did."""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime

from crossbar.hosts import Hosts
from crossbar.leases import Acquired
from crossbar.limiter import Rates
from crossbar.proxy import pace
from crossbar.proxy.call import Call
from crossbar.proxy.placement import Placement
from crossbar.proxy.refusals import for_key
from crossbar.tenants import ClientKey, KeyMeter, OverLimit, Reservation
from crossbar.wire import Tokens


class Charges:
    """Reserve, settle and charge a stopped run against the keys' meter."""

    def __init__(
        self, meter: KeyMeter, clock: IReactorTime, rates: Rates, placement: Placement,
        hosts: Hosts,
    ) -> None:  # fmt: skip
        self._meter = meter
        self._clock = clock
        self._rates = rates
        self._placement = placement
        self._hosts = hosts

    def reserve(
        self, call: Call, key: ClientKey, acquired: Acquired, exact: int | None
    ) -> Reservation:
        """Reserve the call's expected cost against its key's limits, before it queues for a
        slot (a key over its limit never waits behind the fleet): 429 when it does not fit.
        A call without an output limit is expected to write its key's mean completion, else
        its route's, else the meter's default, within what is left of the host's context."""
        prompt, cached = self._prompt(call, acquired, exact)
        rates, route = self._rates, call.route.name
        route_mean = rates.output(route) if rates.knows_output(route) else None
        ctx = self._hosts.ctx(acquired.host, call.model)
        left = None if ctx is None else ctx - prompt
        meter = self._meter
        estimate = meter.estimate(key, prompt, cached, pace.output_limit(call), route_mean, left)
        try:
            return meter.admit(key, estimate, self._clock.seconds(), prompt, cached)
        except OverLimit as e:
            raise for_key(e) from None

    def settle(self, charged: list[Reservation], tokens: Tokens) -> None:
        """Charge the key what the answer really cost, in place of its estimate."""
        now = self._clock.seconds()
        for reservation in charged:
            if tokens.refused:
                reservation.keep(now)  # the host's counts were refused: nothing to go by
            else:
                reservation.settle(tokens.prompt, tokens.cached, tokens.completion, now)

    def stopped(
        self, call: Call, acquired: Acquired, charged: list[Reservation], host: str,
        exact: int | None, sent: float,
    ) -> None:  # fmt: skip
        """A batch request sent at `sent` was stopped for a waiting turn: its key pays what
        the stopped run did, by its host's pace (`pace.stopped_run`), besides the run that
        answers."""
        now = self._clock.seconds()
        prompt, cached = self._prompt(call, acquired, exact)
        limit = pace.output_limit(call)
        ran = pace.stopped_run(self._rates, host, call.model, prompt, cached, now - sent, limit)
        for reservation in charged:
            reservation.ran(*ran, now)

    def _prompt(self, call: Call, acquired: Acquired, exact: int | None) -> tuple[int, int]:
        """The call's prompt tokens (the guard's exact count, else its estimate) and those
        expected cached: what the lease's previous turn left on the host."""
        prompt = exact if exact is not None else call.need
        return prompt, min(prompt, self._placement.expected_cached(call, acquired))
