"""The swap gate, one story each, on a fake clock: a router-mode host that holds fewer models at
once than are asked of it serves its loaded models' turns before a load, gives a model's place
to another only when it has been quiet for its load time or the other has waited `swap_after`,
and lets none wait forever. A host whose capacity is not known has no gate."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from attrs import define, field
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from crossbar.limiter.slots import Limiter, Release, Work

H = "titan"
BOUND = 30.0
LOAD = 2.0  # seconds each model takes to load: how long a quiet model keeps its place


@define
class FakePlaces:
    """A router-mode host as the hosts registry would describe it."""

    capacity_of: dict[str, int | None] = field(factory=lambda: {H: 1})
    runs: dict[str, list[str]] = field(factory=dict)
    keeps: dict[str, tuple[str, ...]] = field(factory=dict)
    bound: float | None = BOUND  # the host's swap_after

    def capacity(self, host: str) -> int | None:
        return self.capacity_of.get(host)

    def running(self, host: str) -> list[str]:
        return list(self.runs.get(host, []))

    def kept(self, host: str) -> Collection[str]:
        return self.keeps.get(host, ())

    def swap_after(self, host: str) -> float | None:
        return self.bound


class Turn:
    """One request's slot as it goes: admitted (with its release), or still waiting."""

    def __init__(self, d: Deferred[Release], model: str) -> None:
        self.model = model
        self.release: Release | None = None
        d.addCallback(self._admitted)
        self.deferred = d

    def _admitted(self, release: Release) -> None:
        self.release = release

    @property
    def waiting(self) -> bool:
        return self.release is None

    def end(self) -> None:
        assert self.release is not None
        self.release()


class Fleet:
    def __init__(self, places: FakePlaces | None = None, parallel: int = 2) -> None:
        self.clock = Clock()
        self.places = places or FakePlaces()
        self.opened: list[tuple[str, str, str | None]] = []
        self.limiter = Limiter(self.clock, lambda h, m: parallel, 64, 3600.0, places=self.places)
        assert self.limiter.gate is not None
        self.limiter.gate.on_open.append(lambda *args: self.opened.append(args))
        for model in ("coder", "chat", "vision"):
            self.limiter.rates.learn_load(H, model, LOAD)

    def turn(self, model: str, host: str = H, work: Any = None) -> Turn:
        return Turn(self.limiter.acquire(host, model, work=work), model)


def test_a_model_takes_a_free_place_and_the_router_is_told():
    f = Fleet()
    coder = f.turn("coder")
    assert not coder.waiting
    assert f.opened == [(H, "coder", None)]
    assert f.limiter.gate.open_models(H) == ["coder"]


def test_a_second_model_waits_while_the_first_runs_and_takes_its_place_once_it_is_quiet():
    f = Fleet()
    first, second = f.turn("coder"), f.turn("coder")
    chat = f.turn("chat")
    assert chat.waiting  # coder's turns hold the host's one place
    first.end()
    assert chat.waiting  # one coder turn still runs: the router would not unload it
    second.end()
    f.clock.advance(LOAD - 0.1)
    assert chat.waiting  # coder's next turn may come any moment: a load back costs as much
    f.clock.advance(0.1)
    assert not chat.waiting
    assert f.opened[-1] == (H, "chat", "coder")  # chat loads in coder's place


def test_a_quiet_models_turn_that_comes_back_keeps_its_place():
    f = Fleet()
    f.turn("coder").end()
    chat = f.turn("chat")
    f.clock.advance(1)
    coder = f.turn("coder")  # the agent's next turn, within coder's load time
    assert not coder.waiting and chat.waiting
    assert f.opened == [(H, "coder", None)]


def test_turns_of_the_loaded_model_go_before_a_load_until_the_bound():
    f = Fleet(parallel=1)
    running = f.turn("coder")
    queued = [f.turn("coder") for _ in range(3)]
    chat = f.turn("chat")
    # Within the bound, each coder turn that ends lets the next coder turn in: no swap yet.
    f.clock.advance(10)
    running.end()
    assert not queued[0].waiting and chat.waiting
    f.clock.advance(BOUND)  # chat's oldest turn has waited past swap_after
    assert chat.waiting  # coder is closed, but its running turn is let finish
    queued[0].end()
    assert not chat.waiting  # coder's place went to chat...
    assert queued[1].waiting and queued[2].waiting  # ...and coder's turns wait their turn


def test_batches_alternate_each_at_least_the_bound_long_and_no_model_waits_forever():
    f = Fleet(parallel=1)
    turns = [f.turn("coder") for _ in range(8)] + [f.turn("chat") for _ in range(8)]
    served: list[str] = []
    for _ in range(16):
        f.clock.advance(5)  # each turn runs 5 s; swap_after is 30 s
        running = next(t for t in turns if not t.waiting)
        turns.remove(running)
        running.end()
        served.append(running.model)
    # Six turns of coder in its first 30 s, then chat's six, then the rest of each: three
    # loads where turn by turn would have taken sixteen.
    assert served == ["coder"] * 6 + ["chat"] * 6 + ["coder"] * 2 + ["chat"] * 2
    assert len(f.opened) == 4


def test_a_kept_model_never_gives_its_place():
    f = Fleet(FakePlaces(capacity_of={H: 2}, keeps={H: ("coder",)}))
    f.turn("coder").end()  # coder holds a place, idle now
    chat = f.turn("chat")
    chat.end()
    f.clock.advance(LOAD)
    vision = f.turn("vision")
    assert not vision.waiting
    assert f.opened[-1] == (H, "vision", "chat")  # the idle kept model was passed over


def test_a_kept_model_runs_even_when_the_other_places_are_busy():
    f = Fleet(FakePlaces(capacity_of={H: 2}, keeps={H: ("coder",)}))
    chat, vision = f.turn("chat"), f.turn("vision")  # both places taken, both busy
    coder = f.turn("coder")
    assert not chat.waiting and not vision.waiting and not coder.waiting
    assert f.opened[-1] == (H, "coder", None)  # it took nobody's place


def test_what_the_host_runs_at_start_holds_its_places():
    f = Fleet(FakePlaces(runs={H: ["chat"]}))
    chat = f.turn("chat")
    assert not chat.waiting
    assert f.opened == []  # nothing to load: it was running
    coder = f.turn("coder")
    assert coder.waiting


def test_models_waiting_for_a_place_take_it_in_the_order_of_their_oldest_turn():
    f = Fleet(parallel=1)
    coder = f.turn("coder")
    vision = f.turn("vision")
    f.clock.advance(1)
    chat = f.turn("chat")
    coder.end()
    f.clock.advance(LOAD)
    assert not vision.waiting and chat.waiting


def test_a_host_whose_capacity_is_not_known_has_no_gate():
    f = Fleet(FakePlaces(capacity_of={H: None}))
    turns = [f.turn(m) for m in ("coder", "chat", "vision")]
    assert not any(t.waiting for t in turns)
    assert f.opened == [] and f.limiter.gate.open_models(H) == []


def test_a_turn_that_never_waits_holds_its_models_place():
    f = Fleet()
    release = f.limiter.track(H, "coder")
    chat = f.turn("chat")
    assert chat.waiting
    release()
    f.clock.advance(LOAD)
    assert not chat.waiting


def test_the_expected_wait_of_a_model_without_a_place_holds_the_bound_and_the_load():
    f = Fleet(parallel=1)
    load = f.limiter.rates.load(H, "chat")
    busy = Work(prefill=0, output=300)  # 10 s at the default 30 tokens/s
    f.turn("coder", work=busy)
    # A place is busy: the wait is the bound (longer than coder's turn) and then the load.
    assert f.limiter.expected_wait(H, "chat") == BOUND + load
    assert f.limiter.expected_wait(H, "coder") > 0  # its one slot is taken
    idle = Fleet(parallel=1)
    assert idle.limiter.expected_wait(H, "chat") == load  # a free place: just the load


def test_a_listing_that_says_an_open_model_was_unloaded_frees_its_place():
    f = Fleet()
    f.turn("coder").end()
    f.places.runs[H] = []  # the router unloaded it for someone else
    f.limiter.gate.sync(H)
    assert f.limiter.gate.open_models(H) == []
    chat = f.turn("chat")
    assert not chat.waiting and f.opened[-1] == (H, "chat", None)


def test_without_swap_after_the_bound_is_four_of_the_waiting_models_loads():
    f = Fleet(FakePlaces(bound=None), parallel=1)
    f.limiter.rates.learn_load(H, "chat", LOAD)  # now 2 s, as every model here
    coder = [f.turn("coder") for _ in range(3)]
    chat = f.turn("chat")
    f.clock.advance(4 * LOAD - 0.1)
    coder[0].end()
    assert chat.waiting and not coder[1].waiting  # within the bound: coder's turns go first
    f.clock.advance(0.1)  # 8 s: chat's bound passed, coder is closed
    coder[1].end()
    assert not chat.waiting and coder[2].waiting
