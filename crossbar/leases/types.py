"""The lease table's values, errors and the seams it is built on (docs/reference.md, "Leases")."""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Sequence
from typing import NamedTuple, Protocol

from attrs import define, field, frozen

from crossbar.records import LeaseEvent


class Key(NamedTuple):
    """What a lease is for: a conversation (`fp`) of a route, for one model.

    A named tuple, not attrs: a key is hashed and compared several times per acquire and per
    index update, and a tuple does both in C (a third of `Table.load`'s time went to an attrs
    class's Python `__hash__`)."""

    route: str
    fp: str
    model: str


class State(enum.Enum):
    """A row's state; the values are what the store keeps."""

    ACTIVE = "active"
    PINNED = "pinned"


@define
class Lease:
    """`key -> host`, with when it was made and last used (seconds, from the injected clock).

    The last six fields are in memory only: the store keeps none of them, a move or a restart
    starts them afresh, and they take no part in comparing leases. Four are the host's cache
    truth for the lease's last turn (warmth.py); `moved` says the lease came to its host by a
    move (at `created`), `remote` that another instance wrote it (its turns there are not
    known here): the valve's hold reads both."""

    key: Key
    host: str
    state: State
    created: float
    last_used: float
    turn_prompt: int = field(default=0, eq=False)  # prompt tokens of the last turn
    turn_cached: int = field(default=0, eq=False)  # of which the host had cached
    cold: bool = field(default=False, eq=False)  # the last turn found its prefix evicted
    turn_opening: str = field(default="", eq=False)  # what the last turn's prompt began with
    moved: bool = field(default=False, eq=False)  # it came to its host by a move, at `created`
    remote: bool = field(default=False, eq=False)  # another instance wrote it


@frozen
class Acquired:
    """The answer to an acquire: `reused` when an existing lease decided the host (its own or
    the route lease it inherits), `pinned` for every request of a pinned route."""

    host: str
    reused: bool
    pinned: bool
    born: bool = field(default=False, eq=False)  # it made the key's first lease (not a move)


@frozen
class Change:
    """Leases saved (upserted) and deleted, and the events that say why, written at once.

    `expect` (key, host it had; "" for none) makes the change conditional: it is written only
    if the store still says so, else nothing is and the store's row comes back (another
    instance got there first). `idle_before` makes the deletes an expiry: a lease last used
    since then (on another instance) is not deleted."""

    save: Sequence[Lease] = ()
    delete: Sequence[Key] = ()
    events: Sequence[LeaseEvent] = ()
    expect: tuple[Key, str] | None = None
    idle_before: float | None = None


@frozen
class Written:
    """What the store did with a change."""

    applied: bool = True  # False: `expect` did not hold, nothing was written
    current: Lease | None = None  # then: the key's row as the store has it (None: no row)
    kept: frozenset[Key] = frozenset()  # an expiry's leases used since `idle_before`
    change_id: int = 0  # the number of its last row in the change log (0: none written)


class LeaseError(Exception):
    """A lease could not be had."""


class NoHost(LeaseError):
    """No candidate is healthy and not draining."""

    def __init__(self, route: str, model: str) -> None:
        super().__init__(
            f"no usable host for route {route!r}, model {model!r}: "
            "every candidate is unhealthy or draining"
        )
        self.route, self.model = route, model


class PinnedDown(LeaseError):
    """The route is pinned to a host that is not healthy; a pin is never silently overridden."""

    def __init__(self, route: str, host: str) -> None:
        super().__init__(f"route {route!r} is pinned to host {host!r}, which is not healthy")
        self.route, self.host = route, host


class UnknownHost(LeaseError):
    """A pin to a host that was never a candidate of the route."""

    def __init__(self, route: str, host: str) -> None:
        super().__init__(f"host {host!r} is not one of the hosts of route {route!r}")
        self.route, self.host = route, host


class LeaseStore(Protocol):
    """What the table (and its journal) need of `crossbar.store.Store`."""

    async def list_leases(self) -> list[Lease]: ...

    async def write(self, change: Change, durable: bool = False) -> Written: ...

    async def ping(self) -> None: ...


class HostStates(Protocol):
    """Health and draining of hosts (crossbar.hosts.Hosts)."""

    def healthy(self, name: str) -> bool: ...

    def draining(self, name: str) -> bool: ...


class HostChooser(Protocol):
    """Picks the host of a new lease (crossbar.leases.Chooser)."""

    def choose(
        self,
        candidates: Sequence[str],
        model: str,
        leases: Callable[[str], int] = ...,
        peers: Collection[str] = (),
        need: int = 0,
        leaving: Lease | None = None,
    ) -> str | None: ...


def pin_key(route: str) -> Key:
    """The key of a route's pin row: fp and model empty."""
    return Key(route, "", "")
