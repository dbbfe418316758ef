"""Which models each router-mode host has loaded, as placement weighs them (docs/reference.md,
"Leases": router mode).

A router-mode host holds a few models at once; running another there means a load (seconds to
minutes) and, when its places are full, the unload of a model whose conversations then lose
their cache. So:

- the chooser ranks each candidate by what running the model there takes (`tier`, the tiers
  of leases/chooser.py): a host with the model loaded, loading or on its way (a lease placed
  there whose request has not gone yet) goes before one with a free place (the one running
  the fewest models first, `crowd`), which goes before one that must unload a model nobody
  uses, which goes before one that must unload the only host of a model with active
  conversations (in flight, waiting, or served in the last five minutes);
- the valve never moves a turn to a host that would unload the only place of a model with
  active conversations (those would lose their cache and wait for a place), and adds to a
  move what the gate's expected wait leaves out (`extra_cost`): the load on a host whose
  capacity is unknown;
- a conversation whose host unloaded its model since its last turn is cold there
  (`unloaded_since`): it follows its model to a host that has it loaded, if one does, rather
  than load it back (placement.py);
- crossbar's own traffic is news of what a host runs (`sent`, `answered`): a request sent for
  a model that is not running loads it, and the first answer after says it is loaded and how
  long the load took (the model's load time, limiter/rates.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from twisted.internet.interfaces import IReactorTime

from crossbar.hosts import FAILED, LOADING, REQUEST, RUNNING, SWAP, Hosts, ModelEvent
from crossbar.leases import EVICTS, FREE_PLACE, KEPT, LOADED, NEVER, SPARE, Table, Warmth
from crossbar.limiter import Limiter

# A lease placed on a host counts its model as on its way there for this long, until its
# request is sent (the guard's count may come first) and the host's listing says more.
EXPECTED_FOR = 60.0


class LoadedModels:
    """Placement's view of router-mode hosts' models (module doc); one per proxy."""

    def __init__(self, hosts: Hosts, limiter: Limiter, warmth: Warmth, clock: IReactorTime):
        self._hosts = hosts
        self._limiter = limiter
        self._warmth = warmth
        self._clock = clock
        self.table: Table | None = None  # set once built: the leases being placed count too
        self._expected: dict[tuple[str, str], float] = {}  # placed there, request not yet sent
        self._unloaded: dict[tuple[str, str], float] = {}  # when the model last left the host

    # -- what a host runs

    def router(self, host: str) -> bool:
        """Whether `host` is a router-mode host."""
        return self._hosts.residency(host) is not None

    def occupying(self, host: str) -> set[str]:
        """The models holding (or about to hold) one of `host`'s places: running there, open
        in the swap gate, or placed there with their request still on its way."""
        held = set(self._hosts.running(host))
        gate = self._limiter.gate
        if gate is not None:
            held.update(gate.open_models(host))
        now = self._clock.seconds()
        for (h, model), at in list(self._expected.items()):
            if now - at > EXPECTED_FOR:
                del self._expected[(h, model)]
            elif h == host:
                held.add(model)
        if self.table is not None:
            held.update(self.table.placing_on(host))
        return held

    def crowd(self, host: str) -> int:
        """How many models hold (or are about to hold) `host`'s places (0: not a router)."""
        return len(self.occupying(host)) if self.router(host) else 0

    def tier(self, host: str, model: str) -> int:
        """What running `model` on `host` takes (leases/chooser.py's tiers)."""
        residency = self._hosts.residency(host)
        if residency is None:
            return LOADED
        kept = self._hosts.kept(host)
        if model in kept:
            return KEPT
        if residency.state(model) == FAILED:
            return NEVER
        held = self.occupying(host)
        if model in held:
            return LOADED
        capacity = residency.capacity
        if capacity is None or len(held) < capacity:
            return FREE_PLACE
        victims = [m for m in held if m not in kept]
        if not victims:
            return NEVER
        return SPARE if any(self._spare(host, m) for m in victims) else EVICTS

    def evicts(self, host: str, model: str) -> int:
        """The active conversations a load of `model` on `host` would unload: those of the
        open model (not kept) that has the fewest there; 0 where a place is free."""
        residency = self._hosts.residency(host)
        if residency is None:
            return 0
        held = self.occupying(host)
        capacity = residency.capacity
        if model in held or capacity is None or len(held) < capacity:
            return 0
        kept = self._hosts.kept(host)
        counts = [self._conversations(host, m) for m in held if m not in kept]
        return min(counts, default=0)

    def _conversations(self, host: str, model: str) -> int:
        """`model`'s conversations going on `host`: served in the last five minutes, or with a
        turn in flight or waiting there."""
        limiter = self._limiter
        going = limiter.in_flight(host, model) + limiter.queued(host, model)
        warmth = self._warmth.host(host)
        served = 0 if warmth is None else warmth.active_of(model, self._clock.seconds())[0]
        return max(going, served)

    def _spare(self, host: str, model: str) -> bool:
        """Whether unloading `model` from `host` costs no conversation its cache: none is
        going there, or another host has it loaded too."""
        if not self._conversations(host, model):
            return True
        return any(
            other != host and model in self.occupying(other)
            for other in self._hosts.names()
            if self.router(other)
        )

    def extra_cost(self, host: str, model: str) -> float:
        """Seconds a turn of `model` moved to `host` pays beyond the limiter's expected wait
        and its own prefill: the load, where no swap gate counts it (the host's capacity is
        unknown) and the model is not running there."""
        residency = self._hosts.residency(host)
        if residency is None or residency.capacity is not None:
            return 0.0
        if model in self.occupying(host):
            return 0.0
        return self._limiter.rates.load(host, model)

    def loaded_elsewhere(self, hosts: Sequence[str], home: str, model: str) -> list[str]:
        """Of `hosts`, those other than `home` where `model` is loaded, loading or on its way."""
        return [h for h in hosts if h != home and self.tier(h, model) <= LOADED]

    # -- news

    def expect(self, host: str, model: str) -> None:
        """A lease of `model` was placed on `host`: its model is on its way there."""
        if self.router(host):
            self._expected[(host, model)] = self._clock.seconds()

    def unloaded_since(self, host: str, model: str, since: float) -> bool:
        """Whether `host` unloaded `model` after `since` (a lease's last turn)."""
        at = self._unloaded.get((host, model))
        return at is not None and at > since

    def sent(self, host: str, model: str) -> float | None:
        """An inference request of `model` goes to `host` now: a model not running there is
        loaded by it (a `load` event). When the model is loading, since when (the request
        waits for the load); else None."""
        residency = self._hosts.residency(host)
        if residency is None:
            return None
        self._expected.pop((host, model), None)
        now = self._clock.seconds()
        if residency.state(model) not in RUNNING:
            self._hosts.tell_models(residency.loading(model, now, REQUEST))
        if not residency.used(model, now):
            return None
        place = residency.places.get(model)
        return None if place is None else place.loading_since

    def answered(self, host: str, model: str, loading_since: float | None, load: float) -> None:
        """An answer of `model` came from `host`: it is loaded. `loading_since` (from `sent`)
        and `load` (its wait before the first byte less its prefill and overhead) teach the
        model's load time, from the first answer after the load only."""
        residency = self._hosts.residency(host)
        if residency is None:
            return
        first = residency.state(model) == LOADING
        residency.answered(model, self._clock.seconds())
        if first and loading_since is not None and load > 0:
            self._limiter.rates.learn_load(host, model, load)

    def model_event(self, event: ModelEvent) -> None:
        """A model load or unload seen or caused (a Hosts model listener): an unloaded model's
        conversations on its host lose their cache there, and the swap gate hears of it."""
        if event.kind != "load":
            self._unloaded[(event.host, event.model)] = event.at
            self._expected.pop((event.host, event.model), None)
            warmth = self._warmth.host(event.host)
            if warmth is not None:
                warmth.forget_model(event.model)
        gate = self._limiter.gate
        if gate is not None and event.reason != REQUEST:
            gate.sync(event.host)

    def opened(self, host: str, model: str, gave_way: str | None) -> None:
        """The swap gate let `model` run on `host`, in the place of `gave_way` (a gate
        listener): the router loads it, and unloads that one for it."""
        residency = self._hosts.residency(host)
        if residency is None:
            return
        now = self._clock.seconds()
        events = []
        if gave_way is not None:
            events += residency.unloading(gave_way, now, SWAP)
        events += residency.loading(model, now, REQUEST)
        self._hosts.tell_models(events)
