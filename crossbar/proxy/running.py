"""The requests the proxy is serving now, and how a stop drains them: each one's coroutine
(as a Deferred) and its exchange, kept from its start until it settles."""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from crossbar.wire import Exchange


class Running:
    """Requests being served; `drain` lets them finish, then aborts the rest."""

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self._active: dict[Any, tuple[Deferred[None], Exchange]] = {}
        self._settled: list[Deferred[None]] = []  # waiters for "no request running"

    def __len__(self) -> int:
        return len(self._active)

    def track(self, request: Any, d: Deferred[None], ex: Exchange) -> None:
        """`request` runs until `d` fires."""
        self._active[request] = (d, ex)
        d.addBoth(self._forget, request)

    def _forget(self, result: object, request: Any) -> object:
        self._active.pop(request, None)
        if not self._active:
            waiters, self._settled = self._settled, []
            for waiter in waiters:
                waiter.callback(None)
        return result

    def _all_settled(self, within: float) -> Deferred[None]:
        """Fires when no request runs, or after `within` seconds, whichever is first."""
        d: Deferred[None] = Deferred()
        if not self._active:
            d.callback(None)
            return d
        self._settled.append(d)

        def give_up() -> None:
            self._settled.remove(d)
            d.callback(None)

        timer = self._clock.callLater(within, give_up)

        def done(result: object) -> object:
            if timer.active():
                timer.cancel()
            return result

        return d.addBoth(done)

    async def drain(self, grace: float) -> int:
        """Let running requests finish for up to `grace` seconds, then abort the rest: their
        connections are closed and their usage rows say "shutdown". Returns how many were
        aborted, once their rows are written."""
        await self._all_settled(grace)
        left = list(self._active.items())
        for request, (d, ex) in left:
            ex.error = "shutdown"
            if request.channel is not None:
                request.channel.transport.abortConnection()
            d.cancel()
        await self._all_settled(grace + 5)
        return len(left)
