"""The swap gate: which models crossbar lets run on a router-mode host that holds fewer models at
once than are asked of it (docs/reference.md, "Slots": router mode).

A router-mode llama-server runs each model as a child server, at most `capacity` at once, and
loads one by unloading its least recently used idle model. Sent turns of three models to a host
that holds one, it would load and unload on every turn: each load costs seconds to minutes, and
each unload wipes that model's prompt cache. So the gate keeps, per host, the models crossbar
lets run there (`open`, at most `capacity` of them), and the limiter admits a waiter only for an
open model:

- a model with no place takes a free one, or the place of an open model crossbar has had
  nothing running or waiting for since as long as that model takes to load (an idle one,
  least recently admitted first; never a `keep_loaded` one): the swap is told to `on_open`, and
  the router unloads that model for the new one. An agent sends its next turn within moments
  of an answer: a model quiet for less than its load time is likely wanted again, and waiting
  that long costs no more than loading it back would (the ski rental's rule);
- while every open model is busy, a model's turns wait, so the loaded models' turns are served
  before a load; once its oldest turn has waited the bound, the open model with the least
  demand (then the least recently admitted, never a kept one) that has held its place for the
  bound too is closed: its new turns wait, and when the last of its running turns ends its
  place goes to the waiting model. The closed model's turns now wait in their turn, so batches
  of each model alternate, each at least the bound long, and none waits forever. The bound is
  the host's `swap_after`, else AUTO_LOADS times the waiting model's load time (at least
  MIN_BOUND): swapping then costs at most about a fifth of the host's time, whether a load
  takes a second or a minute;
- models waiting for a place take it in the order of their oldest waiting turn.

A host's `keep_loaded` models always run (they hold places of their own). A host whose
capacity is not known (None), and every host that is not a router, has no gate.
Turns that must never wait (`queue = false`) run at once and hold their model's place.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol

from attrs import define, field
from twisted.internet.interfaces import IDelayedCall, IReactorTime

# (in flight, waiting, when its oldest waiter began to wait) of one (host, model)
Demand = tuple[int, int, float | None]
AUTO_LOADS = 4.0  # the bound without `swap_after`: this many of the waiting model's loads
MIN_BOUND = 2.0  # seconds: the least bound without `swap_after`
# A timer due at t may run when the clock reads a hair before t (float sums): a time that has
# come is one within this of now.
_EPSILON = 1e-6


class Places(Protocol):
    """What the gate knows of each host (crossbar.hosts.Hosts)."""

    def capacity(self, host: str) -> int | None: ...

    def running(self, host: str) -> list[str]: ...

    def kept(self, host: str) -> Collection[str]: ...

    def swap_after(self, host: str) -> float | None: ...


@define
class _Host:
    """One host's gate: its open models (model -> when one of its turns last entered), when
    each took its place, and those being closed."""

    open: dict[str, float] = field(factory=dict)
    placed: dict[str, float] = field(factory=dict)
    quiet: dict[str, float] = field(factory=dict)  # when its last running turn ended
    closing: set[str] = field(factory=set)
    due: IDelayedCall | None = None  # the next bound to pass

    def take(self, model: str, now: float) -> None:
        self.open[model] = self.placed[model] = self.quiet[model] = now

    def give_up(self, model: str) -> None:
        del self.open[model]
        self.placed.pop(model, None)
        self.quiet.pop(model, None)
        self.closing.discard(model)


class SwapGate:
    """Admission by model on router-mode hosts (module doc); the limiter owns one."""

    def __init__(
        self,
        clock: IReactorTime,
        places: Places,
        demand: Callable[[str, str], Demand],
        models: Callable[[str], Collection[str]],
        wake: Callable[[str], None],
        load: Callable[[str, str], float],
    ) -> None:
        """`demand(host, model)` is the limiter's count of a pair; `models(host)` the models
        the limiter has entries for there; `wake(host)` has the limiter admit what the gate may
        now let in; `load(host, model)` the seconds a load of the model takes there."""
        self._clock = clock
        self._places = places
        self._demand = demand
        self._models = models
        self._wake = wake
        self._load = load
        self._hosts: dict[str, _Host] = {}
        # Told (host, model, the model whose place it took or None) when a model opens.
        self.on_open: list[Callable[[str, str, str | None], None]] = []

    # -- the limiter's questions

    def admits(self, host: str, model: str) -> bool:
        """Whether a turn of `model` may start on `host` now."""
        capacity = self._places.capacity(host)
        if capacity is None:
            return True
        gate = self._gate(host)
        if model in gate.open:
            return model not in gate.closing
        if model in self._places.kept(host):
            return True  # kept loaded there: it holds a place of its own whatever else runs
        line = self._line(host, gate, model)
        return line.index(model) < self._free(host, gate, capacity)

    def enter(self, host: str, model: str, force: bool = False) -> None:
        """A turn of `model` starts on `host` (admitted after `admits`, or `force`d: a turn
        that never waits): it opens there, taking a free place or an idle model's."""
        capacity = self._places.capacity(host)
        if capacity is None:
            return
        gate = self._gate(host)
        now = self._clock.seconds()
        if model in gate.open:
            gate.open[model] = gate.quiet[model] = now
            return
        victim = None
        if len(gate.open) >= capacity and model not in self._places.kept(host):
            idle = self._idle(host, gate)
            victim = idle[0] if idle else None
            if victim is not None:
                gate.give_up(victim)
            elif not force:
                return  # not reached: `admits` said there was a place
        gate.take(model, now)
        for listener in self.on_open:
            listener(host, model, victim)

    def ended(self, host: str, model: str) -> None:
        """A running turn of `model` on `host` ended."""
        gate = self._hosts.get(host)
        if gate is not None and model in gate.open:
            gate.quiet[model] = self._clock.seconds()

    def changed(self, host: str) -> bool:
        """Something ended, left or began to wait on `host`: give up closing where nobody
        waits for a place any more, close a model for a turn that waited its `swap_after`, and
        time the next such wait. False for a host without a gate (nothing to do there)."""
        capacity = self._places.capacity(host)
        if capacity is None:
            return False
        gate = self._gate(host)
        if gate.due is not None and gate.due.active():
            gate.due.cancel()
        gate.due = None
        line = self._line(host, gate, None)
        if not line:
            gate.closing.clear()
        elif self._free(host, gate, capacity) == 0 and not gate.closing:
            due = [self._close_for(host, gate, line[0]), *self._quiet_until(host, gate)]
            now = self._clock.seconds()
            later = [t for t in due if t is not None and t > now + _EPSILON]
            if later:
                gate.due = self._clock.callLater(min(later) - now, self._bound_passed, host)
        return True

    def wait(self, host: str, model: str, drain: Callable[[str], float], load: float) -> float:
        """Seconds until a turn of `model` could start on `host` as far as the gate goes:
        0 when it is open; else the load (`load` seconds) after a place frees: at once when
        one is free, else when an open model drains (`drain(model)`: seconds until its running
        and waiting turns are done), or its turns wait out their `swap_after` first."""
        capacity = self._places.capacity(host)
        if capacity is None:
            return 0.0
        gate = self._gate(host)
        if model in gate.open and model not in gate.closing:
            return 0.0
        if model in gate.open:  # closing: open again once another model had its turn
            return self._bound(host, model) + load
        line = self._line(host, gate, model)
        if line.index(model) < self._free(host, gate, capacity):
            return load
        victims = [m for m in gate.open if m not in self._places.kept(host)]
        if not victims:
            return float("inf")
        bound = self._bound(host, line[0])
        _, _, since = self._demand(host, line[0])
        waited = 0.0 if since is None else self._clock.seconds() - since
        first = max(0.0, bound - waited)
        # Behind others in line: each takes its place after at least one more bound.
        ahead = line.index(model) * bound
        return min(max(first, drain(m)) for m in victims) + ahead + load

    def open_models(self, host: str) -> list[str]:
        """The models open on `host`, least recently entered first (none without a gate)."""
        gate = self._hosts.get(host)
        if gate is None or self._places.capacity(host) is None:
            return []
        return sorted(gate.open, key=gate.open.__getitem__)

    def closing(self, host: str) -> set[str]:
        gate = self._hosts.get(host)
        return set() if gate is None else set(gate.closing)

    def sync(self, host: str) -> None:
        """News of what `host` runs (its listing, a load or unload): an open model the host
        no longer runs, with nothing of crossbar's running or waiting, is no longer open."""
        gate = self._hosts.get(host)
        if gate is None:
            return
        running = set(self._places.running(host))
        for model in list(gate.open):
            in_flight, waiting, _ = self._demand(host, model)
            if model not in running and not in_flight and not waiting:
                gate.give_up(model)
        self._wake(host)

    def forget(self, hosts: Collection[str]) -> None:
        """Keep only `hosts` (a reload removed the others)."""
        for host in [h for h in self._hosts if h not in hosts]:
            gate = self._hosts.pop(host)
            if gate.due is not None and gate.due.active():
                gate.due.cancel()

    # -- internals

    def _gate(self, host: str) -> _Host:
        gate = self._hosts.get(host)
        if gate is None:
            # First asked: what the host runs now holds its places, most recently used last.
            gate = self._hosts[host] = _Host()
            now = self._clock.seconds()
            capacity = self._places.capacity(host) or 0
            running = self._places.running(host)
            for i, model in enumerate(running[max(0, len(running) - capacity) :]):
                gate.open[model] = now - capacity + i  # keep their order
                # Held long enough, quiet long enough: they give way at once.
                gate.placed[model] = gate.quiet[model] = float("-inf")
        return gate

    def _line(self, host: str, gate: _Host, asking: str | None) -> list[str]:
        """Models waiting for a place on `host`, the longest waiting first, then `asking`."""
        waiting = []
        for model in self._models(host):
            if model in gate.open:
                continue
            _, count, since = self._demand(host, model)
            if count and since is not None:
                waiting.append((since, model))
        line = [model for _, model in sorted(waiting)]
        if asking is not None and asking not in line:
            line.append(asking)
        return line

    def _idle(self, host: str, gate: _Host) -> list[str]:
        """Open models with nothing running, not kept, and either closing or with nothing
        waiting and quiet for their load time: the closing ones first, then the least
        recently entered."""
        kept, now = self._places.kept(host), self._clock.seconds()
        idle = []
        for model, entered in gate.open.items():
            in_flight, waiting, _ = self._demand(host, model)
            if in_flight or model in kept:
                continue
            closing = model in gate.closing
            quiet = now - gate.quiet.get(model, float("-inf")) + _EPSILON >= self._load(host, model)
            if closing or (not waiting and quiet):
                idle.append((not closing, entered, model))
        return [model for _, _, model in sorted(idle)]

    def _quiet_until(self, host: str, gate: _Host) -> list[float]:
        """When each open model with nothing running or waiting will have been quiet for its
        load time (and so give way to a waiting model)."""
        kept, times = self._places.kept(host), []
        for model in gate.open:
            in_flight, waiting, _ = self._demand(host, model)
            if not in_flight and not waiting and model not in kept:
                times.append(gate.quiet.get(model, float("-inf")) + self._load(host, model))
        return times

    def _free(self, host: str, gate: _Host, capacity: int) -> int:
        """Places a waiting model could take now: free ones and idle models'."""
        return max(0, capacity - len(gate.open)) + len(self._idle(host, gate))

    def _close_for(self, host: str, gate: _Host, waiting: str) -> float | None:
        """Close an open model for `waiting` once its oldest turn has waited the bound and that
        model has held its place as long; else when that will be (None: never, every open
        model is kept)."""
        _, _, since = self._demand(host, waiting)
        if since is None:
            return None
        bound, now = self._bound(host, waiting), self._clock.seconds()
        kept = self._places.kept(host)
        victims, later = [], []
        for model, entered in gate.open.items():
            if model in kept:
                continue
            ready = gate.placed.get(model, float("-inf")) + bound
            if ready > now + _EPSILON:
                later.append(ready)
                continue
            in_flight, count, _ = self._demand(host, model)
            victims.append((in_flight + count, entered, model))
        due = max(since + bound, min(later)) if later and not victims else since + bound
        if due > now + _EPSILON:
            return due
        if victims:
            gate.closing.add(min(victims)[2])
        return None

    def _bound(self, host: str, waiting: str) -> float:
        """How long `waiting`'s turns wait for a place at most, before a model is closed for
        them (module doc)."""
        fixed = self._places.swap_after(host)
        if fixed is not None:
            return fixed
        return max(MIN_BOUND, AUTO_LOADS * self._load(host, waiting))

    def _bound_passed(self, host: str) -> None:
        self.changed(host)
        self._wake(host)
