"""Where a new lease goes: SPEC §5's chooser, a pure ranking over what the table passes it.

The table knows the leases (how many each host holds for the model, which hosts peer routes
use); the capacity (the limiter) knows the slots. `Chooser.choose` gathers both into one
`HostView` per candidate and `pick` ranks them: no part of it reaches back into the table.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from fractions import Fraction
from typing import Protocol

from attrs import frozen


class Capacity(Protocol):
    """Slots per (host, model): configured or discovered, and free right now."""

    def parallel(self, host: str, model: str) -> int: ...

    def free_slots(self, host: str, model: str) -> int: ...


@frozen
class HostView:
    """One candidate as the chooser weighs it."""

    name: str
    peer: bool  # a peer route of the asking route holds a lease for the model here
    leases: int  # leases of every route held here for the model
    parallel: int  # slots for the model (0 when not yet known)
    free: int  # slots free right now
    held: bool = False  # held out of new placements after flapping (flaps.py)


def pick(views: Sequence[HostView]) -> str | None:
    """The best host for a new lease, or None when there is no candidate.

    Order of preference: a host not held down after flapping (a flapping host holds the
    fewest leases because it keeps losing them, which must not draw new ones to it; it is
    still used when every candidate is held); then a peer host (their caches likely share
    prefixes); then the lowest leases/parallel (an unknown parallel counts as one slot, never
    a division by zero; exact fractions keep 1/3 and 2/6 equal so the next level decides);
    then the most free slots; then the candidates' (config) order.
    """
    if not views:
        return None

    def rank(item: tuple[int, HostView]) -> tuple[bool, bool, Fraction, int, int]:
        order, v = item
        return (v.held, not v.peer, Fraction(v.leases, max(v.parallel, 1)), -v.free, order)

    return min(enumerate(views), key=rank)[1].name


def _no_leases(host: str) -> int:
    return 0


def _never_held(host: str) -> bool:
    return False


@frozen
class Chooser:
    """Reads the capacity of each candidate and picks (SPEC's `Chooser.choose`)."""

    capacity: Capacity
    held: Callable[[str], bool] = _never_held  # hosts.Hosts.held_down in production

    def choose(
        self,
        candidates: Sequence[str],
        model: str,
        leases: Callable[[str], int] = _no_leases,
        peers: Collection[str] = (),
    ) -> str | None:
        """The best of `candidates` for a new lease of `model`; `leases(host)` counts the
        leases held there for the model, `peers` are hosts where a peer route holds one."""
        cap, held = self.capacity, self.held
        return pick(
            [
                HostView(
                    h,
                    h in peers,
                    leases(h),
                    cap.parallel(h, model),
                    cap.free_slots(h, model),
                    held(h),
                )
                for h in candidates
            ]
        )
