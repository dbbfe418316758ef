"""Completion and response ids remembered with their host, so side calls find them (§4.13)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from attrs import define, field, frozen

from crossbar.config import Config


@frozen
class Origin:
    """Where a completion ran, and the fingerprint of its conversation."""

    host: str
    fp: str
    at: float


@define
class IdMemory:
    """An LRU of at most `size` ids, each forgotten `ttl` seconds after it was last seen."""

    size: int
    ttl: float
    _items: OrderedDict[str, Origin] = field(factory=OrderedDict)

    def remember(self, ids: Iterable[str], host: str, fp: str, now: float) -> None:
        if self.size <= 0:
            return
        for id_ in ids:
            self._items[id_] = Origin(host, fp, now)
            self._items.move_to_end(id_)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def lookup(self, id_: str, now: float) -> Origin | None:
        origin = self._items.get(id_)
        if origin is None:
            return None
        if now - origin.at > self.ttl:
            del self._items[id_]
            return None
        return origin

    def reconfigure(self, config: Config) -> None:
        """Take `remember_ids` and `lease_idle`; forget the completions of hosts the config no
        longer has (they are gone with their host)."""
        self.size, self.ttl = config.server.remember_ids, config.server.lease_idle
        for id_ in [i for i, o in self._items.items() if o.host not in config.hosts]:
            del self._items[id_]
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)
