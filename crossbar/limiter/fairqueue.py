"""The waiters of one (host, model): class and priority levels, fair lines, FIFO within a line.

Each waiter belongs to a route and a request class (its `rank`: batch 0, standard 1, interactive
2; config/classes.py), and the route's limits (read through a callable, so a reload takes effect
on `rearrange`) place it:

- **Level**: one per (rank, priority). `take` looks at the highest level with an eligible
  waiter first, so a higher class is admitted before every lower one, and within a class a
  higher priority before every lower one. A waiter's rank may rise while it waits (`raise_to`:
  the limiter's aging), never fall.
- **Line**: within a level, every route that sets no `weight` shares one line (weight 1), in
  arrival order across those routes: with every route at the defaults there is one level and
  one line, which is exactly the old FIFO. A route that sets `weight` has a line of its own.
  Waiters of another class than the level's (batch or standard requests raised by aging) have
  lines of their own in it, so the batch cap can pass over them alone.
- **Fair sharing** between the lines of a level is start-time fair queuing over admissions:
  each line carries the start tag of its next admission; `take` admits from the eligible line
  with the smallest tag (ties: the earlier arrival), sets the level's virtual time to that tag
  and moves the line's tag on by 1 / weight. A line's tag is never taken below the virtual time,
  so a line that sat idle, or whose route sat at its cap, gets no credit for the time it
  missed: over a backlog, lines are admitted in proportion to their weights.
- **Keys within a route**: a route's waiters of different named client keys (`tenant`) share
  the route's admissions the same way, start-time fair queuing by the key's weight (1 unless
  it sets one), so one key's batch cannot starve the route's other keys; waiters of one key,
  and every waiter of a route without keys, keep arrival order.
- **Eligibility** is the caller's, per route and class (a route at its `max_in_flight` is not,
  nor batch at its cap): within a line the first eligible waiter is taken, so a capped
  route's waiters never block anyone else's.

Nothing here knows about slots, time or Deferreds; the limiter decides when to `take`.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, Protocol, TypeVar

from crossbar.config import RouteLimits

SHARED_WEIGHT = 1.0


class Queued(Hashable, Protocol):
    """What the queue needs of a waiter: its route's name and its arrival number; and where it
    has them, its own class (`klass`) and the class it waits at now (`rank`), standard (1)
    otherwise, as its key (`tenant`, `tenant_weight`) is none otherwise."""

    @property
    def route(self) -> str: ...

    @property
    def seq(self) -> int: ...


W = TypeVar("W", bound=Queued)
# (route, the waiter's own class, the class it waits at now): may it be admitted
Eligible = Callable[[str, int, int], bool]
# A weighted route's name (None: the level's shared line), and its waiters' own class.
_LineKey = tuple[str | None, int]
_LevelKey = tuple[int, int]  # (rank, priority)


class _Keys(Generic[W]):
    """One route's waiters in a line: a FIFO per client key, shared fairly by key weight
    (start-time fair queuing, as lines are within a level). With one key (or none) it is the
    route's arrival order."""

    __slots__ = ("_n", "_queues", "_tags", "_vtime")

    def __init__(self) -> None:
        self._queues: dict[str, deque[W]] = {}
        self._tags: dict[str, float] = {}
        self._vtime = 0.0
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __iter__(self) -> Iterator[W]:
        for queue in self._queues.values():
            yield from queue

    def append(self, waiter: W) -> None:
        tenant = getattr(waiter, "tenant", "")
        queue = self._queues.get(tenant)
        if queue is None:
            queue = self._queues[tenant] = deque()
            # A key that was idle gets no credit for the time it missed.
            self._tags[tenant] = max(self._tags.get(tenant, 0.0), self._vtime)
        if queue and queue[-1].seq > waiter.seq:
            # A waiter raised from a lower class keeps its place by arrival.
            at = len(queue) - 1
            while at > 0 and queue[at - 1].seq > waiter.seq:
                at -= 1
            queue.insert(at, waiter)
        else:
            queue.append(waiter)
        self._n += 1

    def head(self) -> W:
        """The waiter to admit next of this route (the route has some)."""
        if len(self._queues) == 1:
            return next(iter(self._queues.values()))[0]
        best: tuple[float, int, W] | None = None
        for tenant, queue in self._queues.items():
            tag = max(self._tags[tenant], self._vtime)
            if best is None or (tag, queue[0].seq) < best[:2]:
                best = (tag, queue[0].seq, queue[0])
        assert best is not None
        return best[2]

    def popleft(self) -> W:
        waiter = self.head()
        tenant = getattr(waiter, "tenant", "")
        tag = max(self._tags[tenant], self._vtime)
        self._vtime = tag
        self._tags[tenant] = tag + 1 / max(getattr(waiter, "tenant_weight", 1.0), 1e-3)
        self._drop(tenant, self._queues[tenant].popleft())
        return waiter

    def remove(self, waiter: W) -> None:
        tenant = getattr(waiter, "tenant", "")
        self._queues[tenant].remove(waiter)
        self._drop(tenant, waiter)

    def _drop(self, tenant: str, waiter: W) -> None:
        self._n -= 1
        if not self._queues[tenant]:
            del self._queues[tenant]
            if self._tags[tenant] <= self._vtime:
                del self._tags[tenant]


class _Line(Generic[W]):
    __slots__ = ("klass", "routes", "tag", "weight")

    def __init__(self, weight: float, tag: float, klass: int) -> None:
        self.weight = weight
        self.tag = tag  # the start tag of this line's next admission
        self.klass = klass  # its waiters' own class
        self.routes: dict[str, _Keys[W]] = {}  # each shared by key, else by arrival

    def head(self, eligible: Eligible, rank: int) -> W | None:
        """The earliest waiter of an eligible route (this line waiting at class `rank`)."""
        best: W | None = None
        for name, waiters in self.routes.items():
            if not waiters:
                continue
            first = waiters.head()
            if (best is None or first.seq < best.seq) and eligible(name, self.klass, rank):
                best = first
        return best


class _Level(Generic[W]):
    __slots__ = ("key", "lines", "vtime")

    def __init__(
        self, key: _LevelKey, vtime: float = 0.0, lines: dict[_LineKey, _Line[W]] | None = None
    ) -> None:
        self.key = key  # (rank, priority)
        self.vtime = vtime  # the start tag of the level's latest admission
        self.lines: dict[_LineKey, _Line[W]] = {} if lines is None else lines


class FairQueue(Generic[W]):
    """Waiters by class and priority, then fair share by weight, then arrival; see the module
    doc."""

    def __init__(self, limits: Callable[[str], RouteLimits]) -> None:
        self._limits = limits
        self._levels: dict[_LevelKey, _Level[W]] = {}
        self._where: dict[W, tuple[_Level[W], _Line[W]]] = {}
        self._counts: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._where)

    def __iter__(self) -> Iterator[W]:
        """Every waiter, in arrival order."""
        return iter(sorted(self._where, key=lambda w: w.seq))

    def count(self, route: str) -> int:
        """Waiters of `route`."""
        return self._counts.get(route, 0)

    def by_route(self) -> dict[str, int]:
        """Waiters per route, by route name."""
        return {name: n for name, n in sorted(self._counts.items()) if n}

    def push(self, waiter: W) -> None:
        """Queue `waiter` at the back of its route's line (arrivals come in `seq` order)."""
        limits = self._limits(waiter.route)
        rank, klass = getattr(waiter, "rank", 1), getattr(waiter, "klass", 1)
        where = (rank, limits.priority)
        level = self._levels.get(where)
        if level is None:
            level = self._levels[where] = _Level(where)
        key = (None if limits.weight is None else waiter.route, klass)
        weight = SHARED_WEIGHT if limits.weight is None else limits.weight
        line = level.lines.get(key)
        if line is None:
            line = level.lines[key] = _Line(weight, level.vtime, klass)
        line.weight = weight
        waiters = line.routes.get(waiter.route)
        if waiters is None:
            waiters = line.routes[waiter.route] = _Keys()
        waiters.append(waiter)
        self._where[waiter] = (level, line)
        self._counts[waiter.route] += 1

    def remove(self, waiter: W) -> None:
        """Take `waiter` out (it left: cancelled, timed out)."""
        level, line = self._where[waiter]
        line.routes[waiter.route].remove(waiter)
        self._forget(waiter, level, line)

    def mixed(self) -> bool:
        """Whether waiters of more than one class rank wait here."""
        ranks = {key[0] for key in self._levels}
        return len(ranks) > 1

    def below(self, rank: int) -> list[W]:
        """The waiters waiting at a class below `rank`, in arrival order."""
        found = [w for key, level in self._levels.items() if key[0] < rank for w in _of(level)]
        return sorted(found, key=lambda w: w.seq)

    def raise_to(self, waiter: W, rank: int) -> None:
        """Move `waiter` up to class `rank` (aging), keeping its arrival order there."""
        self.remove(waiter)
        waiter.rank = rank  # type: ignore[attr-defined]
        self.push(waiter)

    def take(self, eligible: Eligible) -> W | None:
        """Remove and return the waiter to admit next among eligible routes, or None."""
        for where in sorted(self._levels, reverse=True):
            level = self._levels[where]
            best: tuple[float, int, _Line[W], W] | None = None
            for line in level.lines.values():
                head = line.head(eligible, where[0])
                if head is None:
                    continue
                tag = max(line.tag, level.vtime)
                if best is None or (tag, head.seq) < best[:2]:
                    best = (tag, head.seq, line, head)
            if best is None:
                continue
            tag, _, line, waiter = best
            level.vtime = tag
            line.tag = tag + 1 / line.weight
            line.routes[waiter.route].popleft()
            self._forget(waiter, level, line)
            return waiter
        return None

    def rearrange(self) -> None:
        """Place every waiter again by its route's current limits (after a reload), keeping
        arrival order, each level's virtual time and each surviving line's tag."""
        waiters = list(self)
        self._levels = {
            where: _Level(
                where,
                level.vtime,
                {k: _Line(line.weight, line.tag, line.klass) for k, line in level.lines.items()},
            )
            for where, level in self._levels.items()
        }
        self._where.clear()
        self._counts.clear()
        for waiter in waiters:
            self.push(waiter)
        for level in list(self._levels.values()):
            self._prune(level)

    def _forget(self, waiter: W, level: _Level[W], line: _Line[W]) -> None:
        del self._where[waiter]
        self._counts[waiter.route] -= 1
        if not self._counts[waiter.route]:
            del self._counts[waiter.route]
        if not line.routes[waiter.route]:
            del line.routes[waiter.route]
        self._prune(level)

    def _prune(self, level: _Level[W]) -> None:
        # An empty line whose tag the virtual time has reached would restart there anyway;
        # an empty level forgets its lines (with nobody waiting there is nothing to share).
        for key, line in list(level.lines.items()):
            if not line.routes and line.tag <= level.vtime:
                del level.lines[key]
        if all(not line.routes for line in level.lines.values()):
            del self._levels[level.key]


def _of(level: _Level[W]) -> list[W]:
    """Every waiter of a level."""
    return [w for line in level.lines.values() for keys in line.routes.values() for w in keys]
