"""Cache truth: what each host kept warm of the conversations it serves, from its own answers.

Every answer says how much of its prompt the host found cached (`cached_tokens`,
`timings.cache_n`). A conversation's next turn starts with its previous prompt, so a reused
turn whose cached part falls well short of that previous prompt found its own prefix gone: the
host evicted it. Evictions are counted per host, and the conversation is marked cold: it pays
the prefill wherever its next turn goes, so that turn may go to the host with the most room
(proxy/placement.py, event reason `cold`).

Each host's warm capacity is its configured `cache_tokens`, or learned: when a host evicts a
conversation that was active, the tokens of the conversations it served since that
conversation's last turn (the ones that pushed it out, itself included) are more than it keeps;
the running average of those is its capacity. New conversations go where the tokens of the
active conversations (used within ACTIVE_WINDOW) leave room for them (chooser.py); a host whose
capacity is unknown always has room, so it is neither preferred nor penalised for it.

Two more readings feed the valve (proxy/valve.py): a host's recent eviction share (of its
reused turns, how many lately found their prefix gone: a host whose slots other busy
conversations keep taking is not really warm for any of them), and, per route and model, what
a conversation's first turn on the host found cached (a shared system prompt): what a
conversation moved there would find.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from attrs import define, field
from twisted.internet.interfaces import IReactorTime

from crossbar.config import Config
from crossbar.leases.types import Key, Lease
from crossbar.records import LeaseEvent

# A conversation used this recently counts as one its host is keeping warm. Agents send their
# next turn within seconds to a minute or two; one idle for longer that comes back pays at
# most one prefill, and must not keep a host looking full meanwhile.
ACTIVE_WINDOW = 300.0
# A reused turn that finds less than this share of its previous prompt cached, and at least
# MIN_LOST tokens less, found its prefix evicted (a few tokens differ between a reply as
# generated and as the chat template renders it again: not an eviction).
KEPT_SHARE = 0.9
MIN_LOST = 32
# A learned capacity is what the host failed to keep, so it keeps somewhat less: a
# conversation is placed where the active ones, itself included, stay within this share of it.
ROOM_SHARE = 0.8
_LEARN_WEIGHT = 0.25  # of each new eviction's sample in the learned capacity
# Of each reused turn in a host's eviction share: contention changes turn by turn.
_SHARE_WEIGHT = 0.5
_FRESH_WEIGHT = 0.5  # of each first turn's cached tokens in what a newcomer finds
_FRESH_KEPT = 1024  # (route, model) pairs whose first turns a host remembers, newest kept


@define
class HostWarmth:
    """One host's cache as its answers tell it."""

    configured: int | None = None  # `cache_tokens` from the config
    learned: float | None = None  # from evictions
    evictions: int = 0  # reused turns that found their prefix gone
    kept: int = 0  # reused turns that found it
    eviction_share: float = 0.0  # of the recent reused turns, those that found it gone
    # (route, model) -> the cached tokens a conversation's first turn here found, on average
    # (None: one first turn found the host cold, which says nothing of the next).
    fresh: OrderedDict[tuple[str, str], float | None] = field(factory=OrderedDict)
    # Conversations served within ACTIVE_WINDOW, oldest first: tokens of their last turn
    # (prompt and reply, what the host holds for them) and when it ended.
    _active: OrderedDict[Key, tuple[int, float]] = field(factory=OrderedDict)
    _active_tokens: int = 0

    @property
    def capacity(self) -> int | None:
        """Tokens the host keeps warm: configured, else learned, else None (unknown)."""
        if self.configured is not None:
            return self.configured
        return None if self.learned is None else round(self.learned)

    def active_tokens(self, now: float) -> int:
        self._expire(now)
        return self._active_tokens

    def served(self, key: Key, tokens: int, now: float) -> None:
        self.drop(key)
        self._active[key] = (tokens, now)
        self._active_tokens += tokens
        self._expire(now)

    def tokens_of(self, key: Key) -> int:
        """What `key`'s last turn left on the host, while it is active (else 0)."""
        own = self._active.get(key)
        return 0 if own is None else own[0]

    def pressure_since(self, key: Key) -> int | None:
        """Tokens of the conversations served after `key`'s last turn, its own included (None
        when `key` is not among the active ones)."""
        own = self._active.get(key)
        if own is None:
            return None
        total = 0
        for other, (tokens, _) in reversed(self._active.items()):
            if other == key:
                return total + own[0]
            total += tokens
        return None  # not reached: `key` is in the dict

    def first_turn(self, route: str, model: str, cached: int) -> None:
        """A conversation's first turn here found `cached` tokens (a shared prefix). The
        route's first one here finds a cold host: unless it found something, it only primes."""
        pair = (route, model)
        primed = pair in self.fresh
        mean = self.fresh.pop(pair, None)
        if mean is None:
            self.fresh[pair] = cached if primed or cached else None
        else:
            self.fresh[pair] = mean + _FRESH_WEIGHT * (cached - mean)
        if len(self.fresh) > _FRESH_KEPT:
            self.fresh.popitem(last=False)

    def learn(self, sample: int) -> None:
        if self.learned is None:
            self.learned = float(sample)
        else:
            self.learned += _LEARN_WEIGHT * (sample - self.learned)

    def active_of(self, model: str, now: float) -> tuple[int, int]:
        """The active conversations of `model` here, and their tokens."""
        self._expire(now)
        held = [tokens for key, (tokens, _) in self._active.items() if key.model == model]
        return len(held), sum(held)

    def forget_model(self, model: str) -> None:
        """`model` was unloaded here: its conversations hold nothing here any more."""
        for key in [k for k in self._active if k.model == model]:
            self.drop(key)

    def drop(self, key: Key) -> None:
        old = self._active.pop(key, None)
        if old is not None:
            self._active_tokens -= old[0]

    def _expire(self, now: float) -> None:
        active, cutoff = self._active, now - ACTIVE_WINDOW
        while active:
            key, (tokens, at) = next(iter(active.items()))
            if at >= cutoff:
                return
            del active[key]
            self._active_tokens -= tokens


class Warmth:
    """Every host's cache truth; `turn` is told each answered inference turn."""

    def __init__(self, config: Config, clock: IReactorTime) -> None:
        self._clock = clock
        self._hosts: dict[str, HostWarmth] = {}
        self._urls: dict[str, str] = {}
        self.reconfigure(config)

    def reconfigure(self, config: Config) -> None:
        """Hosts the config has, with their `cache_tokens`; what was learned of the others is
        forgotten, and of a host whose URL changed (another server, another cache)."""
        hosts: dict[str, HostWarmth] = {}
        for name, h in config.hosts.items():
            old = self._hosts.get(name)
            warmth = old if old is not None and self._urls.get(name) == h.url else HostWarmth()
            warmth.configured = h.cache_tokens
            hosts[name] = warmth
        self._hosts = hosts
        self._urls = {name: h.url for name, h in config.hosts.items()}

    def host(self, name: str) -> HostWarmth | None:
        return self._hosts.get(name)

    def turn(
        self, lease: Lease, prompt: int, cached: int, completion: int, opening: str = ""
    ) -> bool:
        """An answered turn of `lease`'s conversation on its host: `prompt` tokens of which
        `cached` were found cached; `opening` what its prompt begins with (hashed). When the
        lease served a turn before (on this host: a move makes a new lease) that this one
        continues (the same opening, a prompt no shorter: a session may send other prompts
        beside its conversation, an agent may cut its history), a turn that lost that turn's
        prompt is an eviction: counted, the host's capacity learned, the lease marked cold.
        Returns True for an eviction. Records the turn on the lease (in memory) for the next."""
        warmth = self._hosts.get(lease.host)
        if warmth is None or prompt <= 0:
            return False
        now = self._clock.seconds()
        previous, evicted = lease.turn_prompt, False
        continues = opening == lease.turn_opening and prompt >= previous
        if previous > 0 and continues:
            lost = previous - cached
            evicted = cached < KEPT_SHARE * previous and lost >= MIN_LOST
            warmth.eviction_share += _SHARE_WEIGHT * (float(evicted) - warmth.eviction_share)
            if evicted:
                warmth.evictions += 1
                warmth.active_tokens(now)  # expire first: a sample counts active ones only
                pressure = warmth.pressure_since(lease.key)
                if pressure is not None:
                    warmth.learn(pressure)
            else:
                warmth.kept += 1
        elif previous == 0:
            warmth.first_turn(lease.key.route, lease.key.model, cached)
        lease.turn_prompt, lease.turn_cached, lease.cold = prompt, cached, evicted
        lease.turn_opening = opening
        warmth.served(lease.key, prompt + completion, now)
        return evicted

    def shared(self, host: str, route: str, model: str) -> int:
        """Tokens a conversation of `route` new to `host` is expected to find cached there:
        what its other conversations' first turns found (0 until one has answered)."""
        warmth = self._hosts.get(host)
        mean = None if warmth is None else warmth.fresh.get((route, model))
        return 0 if mean is None else round(mean)

    def eviction_share(self, host: str) -> float:
        """Of `host`'s recent reused turns, the share that found their prefix evicted."""
        warmth = self._hosts.get(host)
        return 0.0 if warmth is None else warmth.eviction_share

    def room(self, host: str, need: int, leaving: Lease | None = None) -> bool:
        """Whether `need` more tokens fit beside the host's active conversations (`leaving`:
        a conversation about to go, not counted). Unknown capacity: always."""
        warmth = self._hosts.get(host)
        if warmth is None or warmth.capacity is None:
            return True
        active = warmth.active_tokens(self._clock.seconds())
        if leaving is not None and leaving.host == host:
            active -= warmth.tokens_of(leaving.key)
        limit = warmth.configured or ROOM_SHARE * warmth.capacity
        return active + need <= limit

    def lease_event(self, event: LeaseEvent) -> None:
        """A lease left a host (moved or dropped; a Table listener): it no longer counts as
        one the host keeps warm."""
        if event.from_host and event.model:
            warmth = self._hosts.get(event.from_host)
            if warmth is not None:
                warmth.drop(Key(event.route, event.fp, event.model))

    def status(self, host: str) -> dict[str, Any]:
        """The host's cache truth for GET /api/hosts."""
        warmth = self._hosts.get(host) or HostWarmth()
        return {
            "evictions": warmth.evictions,
            "kept_turns": warmth.kept,
            "eviction_share": round(warmth.eviction_share, 3),
            "warm_capacity": warmth.capacity,
            "warm_capacity_source": "config"
            if warmth.configured is not None
            else ("learned" if warmth.learned is not None else None),
            "active_tokens": warmth.active_tokens(self._clock.seconds()),
        }
