"""Property: any sequence of acquires, pins, releases, expiry, health flips, removed hosts,
failed writes and the store's recovery leaves the table (and a table reloaded from its store)
where a plain model of the rules says it should be.

While the store fails, changes that serve clients (acquires, removed hosts) apply to memory
and wait; the operator's (pin, unpin, release) and expiry are refused; the store catches up
on the journal's next try.

The store is a MemoryStore whose writes finish at once, so every step runs to its end inside
`run_now`, without a reactor: the runs are deterministic.
"""

from __future__ import annotations

import copy
from collections.abc import Coroutine

from attrs import define, field
from hypothesis import given, settings
from hypothesis import strategies as st

from crossbar.leases.chooser import HostView, pick
from crossbar.leases.journal import StoreUnavailable
from crossbar.leases.table import Acquired, Key, LeaseError, Table
from crossbar.records import LeaseEvent
from tests.support.lease_fakes import FakeHosts, MemoryStore, make_table, run_now

IDLE = 100.0
TOUCH = min(60.0, IDLE / 100)
HOSTS = ("a", "b", "c")
PARALLEL = {"a": 1, "b": 2, "c": 1}
PEERS = {"r2": ("r1",)}
CANDIDATES = {
    ("r1", "m1"): ("a", "b", "c"),
    ("r1", "m2"): ("b", "c"),
    ("r2", "m1"): ("b", "c"),
    ("r2", "m2"): ("c", "a"),
}
ROUTES = ("r1", "r2")


@define
class Held:
    host: str
    last_used: float
    saved_use: float  # last_used as the store has it


@define
class Model:
    """The rules of docs/reference.md, "Leases" and the lease seed, over plain dicts."""

    leases: dict[Key, Held] = field(factory=dict)
    pins: dict[str, str] = field(factory=dict)
    seen: dict[str, set[str]] = field(factory=dict)
    down: set[str] = field(factory=set)
    drained: set[str] = field(factory=set)
    removed: set[str] = field(factory=set)
    events: list[tuple] = field(factory=list)  # this step's
    wrote: bool = False  # this step wrote to the store
    degraded: bool = False  # the store failed; changes wait in memory
    stored: dict[Key, tuple[str, float]] = field(factory=dict)  # leases as the store has them
    stored_pins: dict[str, str] = field(factory=dict)
    waiting: list[tuple] = field(factory=list)  # events kept for the store

    def written(self) -> None:
        """The store takes this model's state (a write landed, or the outage ended)."""
        self.stored = {k: (h.host, h.saved_use) for k, h in self.leases.items()}
        self.stored_pins = dict(self.pins)

    def count(self, host: str, model: str) -> int:
        return sum(1 for k, h in self.leases.items() if h.host == host and k.model == model)

    def peer_hosts(self, route: str, model: str) -> set[str]:
        peers = PEERS.get(route, ())
        return {h.host for k, h in self.leases.items() if k.route in peers and k.model == model}

    def write(self, *events: tuple) -> None:
        self.wrote = True
        self.events.extend(events)

    def place(self, key: Key, host: str, now: float, reason: str, origin: str) -> None:
        self.write((now, key.route, key.fp, key.model, origin, host, reason))
        self.leases[key] = Held(host, now, now)

    def touch(self, held: Held, now: float) -> None:
        if now - held.saved_use > TOUCH:
            self.write()
            held.saved_use = now
        held.last_used = max(held.last_used, now)

    def acquire(self, key: Key, cands: tuple[str, ...], now: float) -> Acquired:
        self.seen.setdefault(key.route, set()).update(cands)
        held, pin = self.leases.get(key), self.pins.get(key.route)
        if pin is not None and pin in cands:
            if pin in self.down:
                raise LeaseError("PinnedDown")
            if held is not None and held.host == pin:
                self.touch(held, now)
                return Acquired(pin, True, True)
            origin = held.host if held else ""
            self.place(key, pin, now, "pin" if held else "new", origin)
            return Acquired(pin, False, True)
        origin, reason = "", "new"
        if held is not None:
            if held.host in cands and held.host not in self.down:
                self.touch(held, now)
                return Acquired(held.host, True, False)
            origin = held.host
            reason = "unhealthy" if held.host in self.down else "config"
        parent = self.leases.get(Key(key.route, "", key.model)) if key.fp else None
        if parent and parent.host in cands and parent.host not in self.down | self.drained:
            self.place(key, parent.host, now, reason, origin)
            return Acquired(parent.host, True, False)
        usable = [h for h in cands if h != origin and h not in self.down | self.drained]
        peers = self.peer_hosts(key.route, key.model)
        host = pick(
            [HostView(h, h in peers, self.count(h, key.model), PARALLEL[h], 0) for h in usable]
        )
        if host is None:
            raise LeaseError("NoHost")
        self.place(key, host, now, reason, origin)
        return Acquired(host, False, False)

    def drop(self, keys: list[Key], now: float, reason: str) -> int:
        if keys:
            self.write(
                *[(now, k.route, k.fp, k.model, self.leases[k].host, "", reason) for k in keys]
            )
        for k in keys:
            del self.leases[k]
        return len(keys)

    def pin(self, route: str, host: str, now: float) -> None:
        if host not in self.seen.get(route, ()):
            raise LeaseError("UnknownHost")
        movers = [k for k, h in self.leases.items() if k.route == route and h.host != host]
        previous = self.pins.get(route)
        if previous == host and not movers:
            return
        self.write(*[(now, route, k.fp, k.model, self.leases[k].host, host, "pin") for k in movers])
        if previous != host:
            self.write((now, route, "", "", previous or "", host, "pin"))
        for k in movers:
            del self.leases[k]
        self.pins[route] = host

    def unpin(self, route: str, now: float) -> None:
        if route in self.pins:
            self.write((now, route, "", "", self.pins.pop(route), "", "release"))

    def drop_host(self, host: str, now: float) -> int:
        pinned = [r for r, h in self.pins.items() if h == host]
        if pinned:
            self.write(*[(now, r, "", "", host, "", "config") for r in pinned])
        for r in pinned:
            del self.pins[r]
        n = self.drop([k for k, h in self.leases.items() if h.host == host], now, "config")
        for hosts in self.seen.values():
            hosts.discard(host)
        self.removed.add(host)
        return n

    def candidates(self, route: str, model: str) -> tuple[str, ...]:
        return tuple(h for h in CANDIDATES[(route, model)] if h not in self.removed)

    def run(self, op: tuple, now: float) -> object:
        """Apply `op` as the rules say; returns the table's expected answer, raises LeaseError
        (with the expected error's name) when the table must refuse."""
        name, *args = op
        if name == "acquire":
            route, fp, model = args
            return self.acquire(Key(route, fp, model), self.candidates(route, model), now)
        if name == "pin":
            return self.pin(args[0], args[1], now)
        if name == "unpin":
            return self.unpin(args[0], now)
        if name == "release":
            return self.drop([k for k in self.leases if k.route == args[0]], now, "release")
        if name == "expire":
            idle = [k for k, h in self.leases.items() if now - h.last_used > IDLE]
            return self.drop(idle, now, "idle")
        assert name == "drop"
        return self.drop_host(args[0], now)


def call(op: tuple, table: Table, cands: tuple[str, ...], now: float) -> Coroutine:
    name, *args = op
    if name == "acquire":
        return table.acquire(Key(*args), cands, now, PEERS.get(args[0], ()))
    if name == "pin":
        return table.pin(args[0], args[1], now)
    if name == "unpin":
        return table.unpin(args[0], now)
    if name == "release":
        return table.release(args[0], now)
    if name == "expire":
        return table.expire_idle(now)
    assert name == "drop"
    return table.drop_hosts({args[0]}, now)


STEPS = {
    "acquire": st.tuples(
        st.just("acquire"),
        st.sampled_from(ROUTES),
        st.sampled_from(("", "x", "y")),
        st.sampled_from(("m1", "m2")),
    ),
    "pin": st.tuples(st.just("pin"), st.sampled_from(ROUTES), st.sampled_from(HOSTS)),
    "unpin": st.tuples(st.just("unpin"), st.sampled_from(ROUTES)),
    "release": st.tuples(st.just("release"), st.sampled_from(ROUTES)),
    "expire": st.tuples(st.just("expire")),
    "drop": st.tuples(st.just("drop"), st.sampled_from(HOSTS)),
    "health": st.tuples(st.just("health"), st.sampled_from(HOSTS)),
    "drain": st.tuples(st.just("drain"), st.sampled_from(HOSTS)),
    "tick": st.tuples(st.just("tick"), st.sampled_from((0.5, 2.0, 40.0, 150.0))),
    "fail": st.tuples(st.just("fail")),
    "retry": st.tuples(st.just("retry")),
}
# Mostly acquires between the rarer operator and sweep steps; a removed host stays removed,
# so removals are rarest.
MIX = ["acquire"] * 12 + ["pin", "health", "tick"] * 2
MIX += ["unpin", "release", "expire", "drop", "health", "drain", "tick", "fail", "retry"]
OPS = st.sampled_from(MIX).flatmap(STEPS.__getitem__)


def check(model: Model, table: Table, store: MemoryStore) -> None:
    """The table, its counters and the store all agree with the model."""
    snapshot = table.snapshot()
    assert {x.key: (x.host, x.last_used) for x in snapshot} == {
        k: (h.host, h.last_used) for k, h in model.leases.items()
    }
    assert table.pins() == model.pins
    assert {k: (x.host, x.last_used) for k, x in store.rows.items() if k.model} == model.stored
    assert {k.route: x.host for k, x in store.rows.items() if not k.model} == model.stored_pins
    assert table.journal.degraded == model.degraded
    for mdl in ("m1", "m2"):
        for host in HOSTS:
            assert table.count(host, mdl) == model.count(host, mdl)
        for route in ROUTES:
            assert table.hosts_with_lease([route], mdl) == {
                h.host for k, h in model.leases.items() if k.route == route and k.model == mdl
            }
    assert len(table._locks) == 0


def event_tuple(e: LeaseEvent) -> tuple:
    return (e.at, e.route, e.fp, e.model, e.from_host, e.to_host, e.reason)


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(st.lists(OPS, min_size=20, max_size=60))
def test_the_table_follows_the_model_of_the_rules(ops):
    store, hosts, model = MemoryStore(), FakeHosts(), Model()
    table = run_now(make_table(store, hosts, idle=IDLE, parallel=PARALLEL))
    now, fail = 0.0, False
    for op in ops:
        name = op[0]
        if name == "tick":
            now += op[1]
        elif name == "fail":
            fail = True  # the next change's write fails
        elif name == "retry":
            before = len(store.events)
            table.journal.clock.advance(30)  # the journal's next try; the store works again
            if model.degraded:
                model.written()
                model.degraded = False
                assert sorted(map(event_tuple, store.events[before:])) == sorted(model.waiting)
                model.waiting = []
        elif name in ("health", "drain"):
            flipped = model.down if name == "health" else model.drained
            flipped ^= {op[1]}
            hosts.down, hosts.drained = set(model.down), set(model.drained)
        else:
            model, fail = run_step(op, model, table, store, now, fail), False
        check(model, table, store)
    reloaded = run_now(make_table(store, FakeHosts(), idle=IDLE, parallel=PARALLEL))
    assert {x.key: x.host for x in reloaded.snapshot()} == {
        k: host for k, (host, _) in model.stored.items()
    }
    assert reloaded.pins() == model.stored_pins


KEPT = ("acquire", "drop")  # changes that serve clients: kept while the store fails


def run_step(op, model: Model, table: Table, store: MemoryStore, now: float, fail: bool) -> Model:
    """Run `op` on a copy of the model and on the table; return the model the table must match."""
    cands = model.candidates(op[1], op[3]) if op[0] == "acquire" else ()
    if cands:
        # Candidates count as seen (for pin's UnknownHost) whatever the acquire's outcome.
        model.seen.setdefault(op[1], set()).update(cands)
    trial = copy.deepcopy(model)
    trial.events, trial.wrote = [], False
    coro = call(op, table, cands, now)
    try:
        answer = trial.run(op, now)
    except LeaseError as e:
        answer = e
    store.fail, seen_events = fail, len(store.events)
    outage = trial.wrote and (fail or model.degraded)
    try:
        got = run_now(coro)
    except StoreUnavailable:
        assert outage and op[0] not in KEPT, op
        model.degraded = True
        return model  # refused: nothing changes (and nothing is written)
    except LeaseError as e:
        assert isinstance(answer, LeaseError) and type(e).__name__ == str(answer), (op, e)
        return model  # a refusal changes nothing, and writes nothing
    finally:
        store.fail = False
    assert got == answer, op
    written = store.events[seen_events:]
    if outage:
        assert op[0] in KEPT, op
        assert written == [], op  # kept in memory for later
        trial.degraded = True
        trial.waiting += trial.events
    else:
        assert sorted(map(event_tuple, written)) == sorted(trial.events), op
        if trial.wrote:
            trial.written()
    return trial
