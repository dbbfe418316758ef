"""Where a new lease goes: SPEC §5's chooser, pure and deterministic.

The chooser reads the world only through the callables it is built from, so it imports neither
the lease table nor the limiter nor the hosts. The table is built after the chooser (it needs
one), so the service hands the chooser closures over a `Late` holder filled in afterwards:

    table_ref: Late[Table] = Late()
    chooser = Chooser(
        load=lambda host, model: table_ref.get().count(host, model),
        parallel=lambda host, model: hosts.parallel(host, model),
        free_slots=lambda host, model: limiter.free_slots(host, model),
        peer_hosts=lambda route, model: table_ref.get().hosts_with_lease(peers(route), model),
    )
    table_ref.set(await Table.load(store, hosts, chooser, idle))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Generic, TypeVar

from attrs import define

T = TypeVar("T")


@define
class Late(Generic[T]):
    """A slot for an object built later, so closures made now can reach it."""

    _value: T | None = None

    def set(self, value: T) -> None:
        self._value = value

    def get(self) -> T:
        if self._value is None:
            raise RuntimeError("Late.get() before set(): the object is not built yet")
        return self._value


@define
class Chooser:
    """Picks the host for a new lease among candidates the table already found usable.

    Order of preference: a host where a peer route of `route` holds a lease for the model
    (their caches likely share prefixes); then the lowest leases/parallel for the model (leases
    of every route on that host); then the most free slots; then the candidates' (config) order.
    """

    load: Callable[[str, str], int]  # (host, model) -> leases held there for model
    parallel: Callable[[str, str], int]  # (host, model) -> slots for model
    free_slots: Callable[[str, str], int]  # (host, model) -> slots free right now
    peer_hosts: Callable[[str, str], set[str]]  # (route, model) -> hosts of peer leases

    def choose(self, candidates: Sequence[str], model: str, route: str = "") -> str | None:
        """The best of `candidates` for a new lease of `model` on `route`; None if empty."""
        if not candidates:
            return None
        peers = self.peer_hosts(route, model) if route else set()

        def rank(item: tuple[int, str]) -> tuple[bool, Fraction, int, int]:
            order, host = item
            # parallel unknown (not yet discovered) or 0 counts as one slot, never a division
            # by zero; Fraction keeps 1/3 and 2/6 exactly equal so the next level decides.
            share = Fraction(self.load(host, model), max(self.parallel(host, model), 1))
            return (host not in peers, share, -self.free_slots(host, model), order)

        return min(enumerate(candidates), key=rank)[1]
