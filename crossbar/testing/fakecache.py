"""The fake llama-server's prompt cache: `parallel` slots and an LRU of idle caches.

Modelled on llama-server: a request takes the free slot whose cached tokens share the longest
prefix with its prompt (or loads a better idle cache into a free slot), reuses that prefix and
processes the rest. When a slot is taken by another conversation, what it held is saved to the
LRU so it can come back. Requests beyond `parallel` wait here, in order.
"""

from __future__ import annotations

from attrs import define, field, frozen
from twisted.internet.defer import Deferred


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@define
class Slot:
    """One of the server's request slots and the tokens its KV cache holds."""

    id: int
    tokens: list[int] = field(factory=list)
    busy: bool = False
    id_task: int = -1
    last_used: int = 0


@frozen
class Claim:
    """A slot granted to one request: `cache_n` prompt tokens are reused, `prompt_n` are new."""

    slot: Slot
    cache_n: int
    prompt_n: int


@define
class _Waiter:
    prompt: list[int] | None
    id_slot: int | None
    use_cache: bool
    deferred: Deferred[Claim]


class PromptCache:
    """Slots, idle caches and the queue of requests waiting for a slot."""

    def __init__(self, parallel: int, cache_slots: int) -> None:
        self.slots = [Slot(i) for i in range(parallel)]
        self.idle: list[list[int]] = []  # least recently used first
        self._cache_slots = cache_slots
        self._waiters: list[_Waiter] = []
        self._tick = 0
        self._tasks = 0

    @property
    def queued(self) -> int:
        return len(self._waiters)

    @property
    def busy(self) -> int:
        return sum(s.busy for s in self.slots)

    def claim(
        self, prompt: list[int] | None, id_slot: int | None = None, use_cache: bool = True
    ) -> Deferred[Claim]:
        """A slot for `prompt` (or, with `prompt=None`, slot `id_slot` as it is, for slot
        actions). Fires at once when one is free, else when one frees up; cancel to leave."""
        if id_slot is not None and not 0 <= id_slot < len(self.slots):
            raise ValueError(f"invalid slot id {id_slot}")

        def leave(d: Deferred[Claim]) -> None:
            self._waiters = [w for w in self._waiters if w.deferred is not d]

        waiter = _Waiter(prompt, id_slot, use_cache, Deferred(leave))
        self._waiters.append(waiter)
        self._serve()
        return waiter.deferred

    def release(self, slot: Slot, tokens: list[int] | None = None) -> None:
        """Free `slot`; `tokens` (when given) is what its KV cache now holds."""
        if tokens is not None:
            slot.tokens = list(tokens)
        slot.busy = False
        slot.id_task = -1
        self._tick += 1
        slot.last_used = self._tick
        self._serve()

    def erase(self, slot: Slot) -> int:
        n = len(slot.tokens)
        slot.tokens = []
        return n

    def _serve(self) -> None:
        for waiter in list(self._waiters):
            claim = self._grant(waiter)
            if claim is not None:
                self._waiters.remove(waiter)
                waiter.deferred.callback(claim)

    def _grant(self, waiter: _Waiter) -> Claim | None:
        free = [s for s in self.slots if not s.busy]
        if waiter.id_slot is not None:
            free = [s for s in free if s.id == waiter.id_slot]
        if not free:
            return None
        prompt = waiter.prompt
        if prompt is None:
            slot, cache_n = free[0], 0
        else:
            slot, cache_n = self._place(prompt, free, waiter.use_cache)
        slot.busy = True
        self._tasks += 1
        slot.id_task = self._tasks
        n = 0 if prompt is None else len(prompt)
        # llama-server always evaluates at least one prompt token, even on a full cache hit.
        cache_n = min(cache_n, max(n - 1, 0))
        return Claim(slot, cache_n, n - cache_n)

    def _place(self, prompt: list[int], free: list[Slot], use_cache: bool) -> tuple[Slot, int]:
        """Pick the slot for `prompt` and put the best cache for it there; returns the slot
        and the reusable prefix length."""
        if not use_cache:
            slot = min(free, key=lambda s: (len(s.tokens) > 0, s.last_used))
            self._save(slot.tokens)
            slot.tokens = []
            return slot, 0
        # Longest shared prefix wins; among equals, the least recently used slot (an empty
        # one first), which keeps the caches most likely to be wanted again.
        slot = max(free, key=lambda s: (common_prefix(s.tokens, prompt), -s.last_used))
        best = common_prefix(slot.tokens, prompt)
        stored = max(self.idle, key=lambda t: common_prefix(t, prompt), default=None)
        if stored is not None and common_prefix(stored, prompt) > best:
            self.idle.remove(stored)
            self._save(slot.tokens)
            slot.tokens = stored
            return slot, common_prefix(stored, prompt)
        if best < len(slot.tokens):
            # Another conversation takes this slot: keep what it held for later.
            self._save(slot.tokens)
            slot.tokens = slot.tokens[:best]
        return slot, best

    def _save(self, tokens: list[int]) -> None:
        if not tokens or self._cache_slots <= 0:
            return
        n = len(tokens)
        if any(len(t) >= n and t[:n] == tokens for t in self.idle):
            return  # an idle cache already covers it
        self.idle = [t for t in self.idle if not (len(t) <= n and tokens[: len(t)] == t)]
        self.idle.append(list(tokens))
        del self.idle[: max(0, len(self.idle) - self._cache_slots)]

    def describe(self) -> dict[str, object]:
        """Token counts per slot and idle cache, for `/_fake/counters` and debugging."""
        return {
            "slots": [{"id": s.id, "busy": s.busy, "n_tokens": len(s.tokens)} for s in self.slots],
            "idle": [len(t) for t in self.idle],
            "queued": self.queued,
        }
