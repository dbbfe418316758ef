"""Where a new lease goes: a pure ranking over what the table passes it (docs/reference.md,
"Leases").

The table knows the leases (how many each host holds for the model, counting placements still
being written, and which hosts peer routes use); the limiter knows the slots and what each host
is doing now (in flight and queued); the cache truth (warmth.py) knows which hosts have room to
keep one more conversation warm; on router-mode hosts, what it would take to run the model
there (`Loads.tier`: kept, loaded, a load into a free place, or a load that unloads another).
`Chooser.choose` gathers them into one `HostView` per candidate and `pick` ranks them: no part
of it reaches back into the table.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from fractions import Fraction
from typing import Protocol

from attrs import frozen

from crossbar.leases.types import Lease


class Capacity(Protocol):
    """Slots per (host, model) and what is using them (crossbar.limiter.Limiter)."""

    def parallel(self, host: str, model: str) -> int: ...

    def free_slots(self, host: str, model: str) -> int: ...

    def in_flight(self, host: str, model: str) -> int: ...

    def queued(self, host: str, model: str) -> int: ...

    def batch_room(self, host: str, model: str, route: str = "") -> int: ...


# What running the model on a host takes (`Loads.tier`), best first: a host that keeps it
# loaded (`keep_loaded`); one where it is loaded, loading or on its way (every host that is not
# a router); a load into a free place; a load that unloads a model nobody is using there (or
# that another host has loaded too); a load that unloads the only host of a model with active
# conversations; never (it failed to load there, or every place is kept for other models).
KEPT, LOADED, FREE_PLACE, SPARE, EVICTS, NEVER = range(6)


class Loads(Protocol):
    """Which hosts have which models loaded (crossbar.proxy.LoadedModels)."""

    def tier(self, host: str, model: str) -> int: ...

    def crowd(self, host: str) -> int: ...

    def evicts(self, host: str, model: str) -> int: ...


class Room(Protocol):
    """Which hosts can keep one more conversation warm (crossbar.leases.Warmth)."""

    def room(self, host: str, need: int, leaving: Lease | None = None) -> bool: ...


@frozen
class HostView:
    """One candidate as the chooser weighs it."""

    name: str
    peer: bool  # a peer route of the asking route holds a lease for the model here
    leases: int  # leases of every route held here for the model, placements under way included
    parallel: int  # slots for the model (0 when not known)
    free: int  # slots free right now
    held: bool = False  # held out of new placements after flapping (hosts/flaps.py)
    busy: int = 0  # requests in flight and queued here for the model now
    room: bool = True  # its cache keeps the new conversation warm beside its active ones
    tier: int = LOADED  # what running the model here takes (above)
    crowd: int = 0  # models holding the host's places (a router-mode host's)
    evicts: int = 0  # active conversations of the model a load here would unload
    # For a batch request (None for anything else): batch requests its cap lets start here
    # now, less the batch already waiting (Capacity.batch_room); and whether its shared
    # system prompt last went here (`home`).
    batch_room: int | None = None
    home: bool = False


def pick(views: Sequence[HostView]) -> str | None:
    """The best host for a new lease, or None when there is no candidate.

    Order of preference: a host not held down after flapping (a flapping host holds the
    fewest leases because it keeps losing them, which must not draw new ones to it; it is
    still used when every candidate is held); then the best tier (a model load costs seconds
    to minutes and an unload wipes another model's cache: a host that has the model loaded
    goes before any that would load it, and a free place before an unload; of the hosts with a
    free place, the one with the fewest models running, so models spread over the fleet's
    machines; where it must unload another, the one holding most of the model's leases, so a
    model's conversations gather where its loads are batched, then the one whose unload costs
    the fewest active conversations, so a cold model never unseats a hot one); then one with
    room
    to keep the conversation warm (a conversation placed where it is evicted pays its prefill
    again every turn); then a peer host (their caches likely share prefixes); then the lowest
    leases/parallel (placements being written count, so conversations arriving together
    spread as if one by one; exact fractions keep 1/3 and 2/6 equal so the next level
    decides); then the lowest busy/parallel (what the host does now); then the most free
    slots; then the candidates' (config) order. A parallel below 1 counts as one slot, never
    a division by zero.
    """
    if not views:
        return None
    if views[0].batch_room is not None:
        return _pick_batch(views)

    def rank(
        item: tuple[int, HostView],
    ) -> tuple[bool, int, int, int, int, bool, bool, Fraction, Fraction, int, int]:
        order, v = item
        slots = max(v.parallel, 1)
        return (
            v.held,
            v.tier,
            v.crowd if v.tier == FREE_PLACE else 0,
            -v.leases if v.tier >= SPARE else 0,
            v.evicts if v.tier >= SPARE else 0,
            not v.room,
            not v.peer,
            Fraction(v.leases, slots),
            Fraction(v.busy, slots),
            -v.free,
            order,
        )

    return min(enumerate(views), key=rank)[1].name


def _pick_batch(views: Sequence[HostView]) -> str:
    """The host for a batch request, which has no conversation to keep warm: a host not held
    down, then the best tier (as `pick`: a batch request must not load a model over another's
    only place); then one where its batch cap lets it start now, the host its shared system
    prompt last went to first (its prefix is cached there); where none can start it now, the
    shortest batch queue past its cap, its home first among equals. The batch cap follows the
    turns (limiter/slots.py), so the host with the fewest active conversations has the most
    room: batch keeps off the hosts people are working on. Then the lowest busy/parallel,
    then the candidates' order."""

    def rank(item: tuple[int, HostView]) -> tuple[bool, int, bool, bool, int, bool, Fraction, int]:
        order, v = item
        room = v.batch_room if v.batch_room is not None else 0
        starts = room > 0
        return (
            v.held,
            v.tier,
            not starts,
            starts and not v.home,
            -room,
            not v.home,
            Fraction(v.busy, max(v.parallel, 1)),
            order,
        )

    return min(enumerate(views), key=rank)[1].name


def _no_leases(host: str) -> int:
    return 0


def _never_held(host: str) -> bool:
    return False


def _always_known(host: str, model: str) -> bool:
    return True


@frozen
class Chooser:
    """Reads the capacity of each candidate and picks (docs/reference.md, "Python shapes")."""

    capacity: Capacity
    held: Callable[[str], bool] = _never_held  # hosts.Hosts.held_down in production
    # Whether a host's slots for the model are known yet (configured or read from /props).
    known: Callable[[str, str], bool] = _always_known
    warmth: Room | None = None
    loads: Loads | None = None

    def choose(
        self,
        candidates: Sequence[str],
        model: str,
        leases: Callable[[str], int] = _no_leases,
        peers: Collection[str] = (),
        need: int = 0,
        leaving: Lease | None = None,
        batch: str | None = None,
        home: str | None = None,
    ) -> str | None:
        """The best of `candidates` for a new lease of `model`; `leases(host)` counts the
        leases held there for the model, `peers` are hosts where a peer route holds one,
        `need` the tokens the conversation is expected to keep warm, `leaving` a lease being
        placed again (it no longer counts on its host). `batch`: the route of a batch request
        (None for any other), placed by its room under the batch cap (`_pick_batch`), `home`
        the host its shared system prompt last went to.

        A host whose slots are not known yet is weighed as one with the known candidates'
        typical `parallel` (their mean): neither preferred nor penalised for it."""
        cap, held, known, warmth, loads = (
            self.capacity, self.held, self.known, self.warmth, self.loads,
        )  # fmt: skip
        parallels = {h: cap.parallel(h, model) for h in candidates}
        sure = [p for h, p in parallels.items() if p > 0 and known(h, model)]
        typical = max(1, round(sum(sure) / len(sure))) if sure else 1
        views = []
        for h in candidates:
            busy = cap.in_flight(h, model) + cap.queued(h, model)
            if parallels[h] > 0 and known(h, model):
                parallel, free = parallels[h], cap.free_slots(h, model)
            else:
                parallel, free = typical, max(0, typical - cap.in_flight(h, model))
            count = leases(h)
            if leaving is not None and leaving.host == h:
                count -= 1
            room = True if warmth is None or batch is not None else warmth.room(h, need, leaving)
            tier = LOADED if loads is None else loads.tier(h, model)
            crowd = evicts = 0
            if loads is not None:
                crowd = loads.crowd(h)
                evicts = loads.evicts(h, model) if tier >= SPARE else 0
            spare = None if batch is None else cap.batch_room(h, model, batch)
            view = HostView(
                h, h in peers, count, parallel, free, held(h), busy, room, tier, crowd, evicts,
                spare, h == home,
            )  # fmt: skip
            views.append(view)
        return pick(views)
