"""Which models a router-mode host has loaded now, how many it holds at once, and each load and
unload crossbar saw or caused (docs/reference.md, "Hosts": router mode).

A router-mode llama-server (`models = "discover"`) runs each model as a child server, loaded on
its first request and unloaded, least recently used first, when a load would pass its
`--models-max`. Two sources say what is loaded: the router's `GET /models`, read at each good
probe, and crossbar's own traffic (a request sent for a model that is not loaded loads it; its
first answer byte says it is loaded; crossbar's swap gate, limiter/swaps.py, gives a model's
place to another). The newest news wins: a listing asked before crossbar's own news of a model
does not undo it.

How many models the host holds at once (`capacity`): the host's `max_loaded`, else the router's
`/props` `max_instances` (0 there: no limit), else learned from what the router unloads (the
models running just before it unloaded one to load another), else unknown (None: no limit
known, nothing is held back for it).
"""

from __future__ import annotations

from collections.abc import Mapping

from attrs import define, field, frozen

LOADED, LOADING, UNLOADED, FAILED = "loaded", "loading", "unloaded", "failed"
# A child server that runs: it holds one of the router's places.
RUNNING = frozenset({LOADED, LOADING, "sleeping"})

# Why a model was loaded or unloaded (ModelEvent.reason).
REQUEST = "request"  # crossbar sent a request for it where it was not loaded
SWAP = "swap"  # crossbar gave its place to another model (the router unloads it for that load)
OPERATOR = "operator"  # the admin API's load or unload
KEEP = "keep"  # the host's `keep_loaded`
ROUTER = "router"  # seen in the router's listing: another client, or the router itself


@frozen
class ModelEvent:
    """A load (`kind` "load"), unload ("unload") or failed load ("fail") of `model` on
    `host`, at `at` on crossbar's clock, and why (`reason`, above)."""

    at: float
    host: str
    model: str
    kind: str
    reason: str

    def as_dict(self) -> dict[str, object]:
        return {"at": self.at, "host": self.host, "model": self.model, "kind": self.kind,
                "reason": self.reason}  # fmt: skip


@define
class Place:
    """One model on the host: its state, when that was learned, and when crossbar last sent
    it a request (the router unloads the least recently used)."""

    state: str
    news: float
    last_used: float = 0.0
    loading_since: float | None = None  # crossbar saw (or made) it begin to load


@define
class Residency:
    """One router-mode host's models as crossbar knows them (module doc)."""

    host: str
    configured: int | None = None  # the host's max_loaded
    props: int | None = None  # the router's /props max_instances (0: no limit)
    learned: int | None = None
    places: dict[str, Place] = field(factory=dict)
    listed: bool = False  # a listing has been taken
    props_read: bool = False  # the router's /props was read (again after the host was down)

    @property
    def capacity(self) -> int | None:
        """Models held at once (module doc); None when no limit is known."""
        if self.configured is not None:
            return self.configured
        if self.props is not None:
            return self.props or None
        return self.learned

    @property
    def capacity_source(self) -> str | None:
        if self.configured is not None:
            return "config"
        if self.props is not None:
            return "props"
        return "learned" if self.learned is not None else None

    def state(self, model: str) -> str | None:
        place = self.places.get(model)
        return None if place is None else place.state

    def running(self) -> list[str]:
        """The models holding a place now, least recently used first."""
        held = [(p.last_used, name) for name, p in self.places.items() if p.state in RUNNING]
        return [name for _, name in sorted(held)]

    def take_listing(self, listed: Mapping[str, str], asked: float) -> list[ModelEvent]:
        """What `GET /models` listed, asked at `asked`: each model's state, unless crossbar's
        own news of it is newer. A model that went from running to unloaded was unloaded by
        the router (a failed one, `fail`), one that came to run was loaded by someone else;
        the first listing only says how things are."""
        events: list[ModelEvent] = []
        before = len(self.running())
        went, came = [], []
        for name, state in listed.items():
            place = self.places.get(name)
            if place is None:
                self.places[name] = Place(state, asked)
                if self.listed and state in RUNNING:
                    came.append(name)
                continue
            if place.news > asked or place.state == state:
                continue
            if place.state in RUNNING and state not in RUNNING:
                went.append(name)
                kind = "fail" if state == FAILED else "unload"
                events.append(ModelEvent(asked, self.host, name, kind, ROUTER))
            elif place.state not in RUNNING and state in RUNNING:
                came.append(name)
            place.state, place.news, place.loading_since = state, asked, None
        for name in list(self.places):
            if name not in listed:
                del self.places[name]  # the router no longer has it at all
        for name in came:
            events.append(ModelEvent(asked, self.host, name, "load", ROUTER))
        if went and came and self.configured is None and self.props is None:
            # The router unloaded to make room: it holds no more than were running before.
            self.learned = before if self.learned is None else min(self.learned, before)
        self.listed = True
        return events

    def loading(self, model: str, now: float, reason: str) -> list[ModelEvent]:
        """crossbar is sending `model` its first request here while it is not running: the
        router loads it (a `load` event, `reason`). Nothing when it runs already."""
        place = self.places.setdefault(model, Place(UNLOADED, now))
        place.last_used = now
        if place.state in RUNNING:
            return []
        place.state, place.news, place.loading_since = LOADING, now, now
        return [ModelEvent(now, self.host, model, "load", reason)]

    def unloading(self, model: str, now: float, reason: str) -> list[ModelEvent]:
        """`model` leaves its place here (crossbar gave it to another, or the operator
        unloaded it): an `unload` event when it was running."""
        place = self.places.get(model)
        if place is None or place.state not in RUNNING:
            return []
        place.state, place.news, place.loading_since = UNLOADED, now, None
        return [ModelEvent(now, self.host, model, "unload", reason)]

    def used(self, model: str, now: float) -> bool:
        """crossbar sends `model` a request here; True while the model is still loading (the
        request waits for the load)."""
        place = self.places.get(model)
        if place is None:
            return False
        place.last_used = now
        return place.state == LOADING

    def answered(self, model: str, now: float) -> None:
        """An answer of `model` began here: it is loaded."""
        place = self.places.setdefault(model, Place(LOADED, now))
        if place.state != LOADED:
            place.state, place.news = LOADED, now
        place.loading_since = None

    def status(self) -> dict[str, object]:
        """The host's capacity for GET /api/hosts."""
        return {
            "max_loaded": self.capacity,
            "max_loaded_source": self.capacity_source,
            "running": self.running(),
        }
