"""What one host serves now, and each model's slots and context.

A host's models are its configured ones, or, with `models = "discover"` (a router-mode
llama-server), what its `GET /models` last listed, each with its state there: `loaded`,
`unloaded` (the router loads it on its first request: not a health failure), `loading`,
`sleeping`, `downloading` or `failed`. `parallel` and `ctx` come from the config where it sets
them (for discovered models, the host's own keys), else from the model's `/props`, else 1 slot
and an unknown context.
"""

from __future__ import annotations

from typing import Any

from attrs import define, field, frozen

from crossbar.config import HostConfig, ModelConfig, Route
from crossbar.hosts.health import Props

LOADED = "loaded"


@define
class Catalog:
    """One host's models, with what `/props` and `/models` said of them."""

    config: HostConfig
    props: dict[str, Props] = field(factory=dict)  # by model name
    listed: dict[str, str] = field(factory=dict)  # discovered: model -> state, in /models order
    props_done: bool = False  # configured models: /props read for each that needs it
    refused_ids: set[str] = field(factory=set)  # listed ids model_id_fault refused (logged once)
    _discovered: tuple[ModelConfig, ...] = ()
    _indexed: tuple[ModelConfig, ...] | None = field(default=None, init=False, eq=False)
    _index: dict[str, ModelConfig] = field(factory=dict, init=False, eq=False)

    def models(self) -> tuple[ModelConfig, ...]:
        """The models the host serves now."""
        return self._discovered if self.config.discover else self.config.models

    def model(self, name: str) -> ModelConfig | None:
        models = self.models()
        if models is not self._indexed:  # by name, once per listing: asked on every request
            self._index = {}
            for m in models:
                self._index.setdefault(m.name, m)
            self._indexed = models
        return self._index.get(name)

    def parallel(self, name: str) -> int:
        """Slots: configured, else `/props` `total_slots`, else 1 (also for a model the host
        does not serve, which the limiter may still ask about while requests drain)."""
        m = self.model(name)
        if m is None:
            return 1
        if m.parallel is not None:
            return m.parallel
        props = self.props.get(name)
        return props.total_slots if props and props.total_slots else 1

    def knows_parallel(self, name: str) -> bool:
        """Whether the model's slots are known: configured, or read from `/props` (else
        `parallel` says 1 only for want of better)."""
        m = self.model(name)
        if m is None or m.parallel is not None:
            return m is not None
        props = self.props.get(name)
        return bool(props and props.total_slots)

    def ctx(self, name: str) -> int | None:
        """Tokens per slot: configured, else `/props` `n_ctx`, else None (unknown)."""
        m = self.model(name)
        if m is None:
            return None
        if m.ctx is not None:
            return m.ctx
        props = self.props.get(name)
        return props.n_ctx if props else None

    def state(self, name: str) -> str | None:
        """A discovered model's state in the host's `/models` (None for configured ones)."""
        return self.listed.get(name) if self.config.discover else None

    def wanting_props(self) -> list[ModelConfig]:
        """The models whose `/props` is to be read now: configured ones until it was read
        for all, discovered ones once they are loaded (reading an unloaded model's settings
        would load it)."""
        unset = [m for m in self.models() if m.parallel is None or m.ctx is None]
        if not self.config.discover:
            return [] if self.props_done else unset
        return [m for m in unset if self.listed.get(m.name) == LOADED and m.name not in self.props]

    def take_listing(self, listed: dict[str, str]) -> bool:
        """What `/models` listed now; True when it differs from before. A model that is no
        longer loaded forgets its `/props` (loaded again, it may have other settings)."""
        changed = listed != self.listed or list(listed) != list(self.listed)
        for name in list(self.props):
            if listed.get(name) != LOADED:
                del self.props[name]
        self.listed = dict(listed)
        c = self.config
        self._discovered = tuple(
            ModelConfig(name, upstream=name, parallel=c.parallel, ctx=c.ctx) for name in listed
        )
        return changed

    def take_props(self, found: dict[str, Props], failed: dict[str, str]) -> None:
        self.props.update(found)
        if not self.config.discover:
            self.props_done = not failed

    def reconfigured(self, new: HostConfig) -> Catalog:
        """This host under a reloaded config: what was read at the same URL is kept (and read
        again for configured models, whose settings may have changed)."""
        if new.url != self.config.url or new.discover != self.config.discover:
            return Catalog(new)
        catalog = Catalog(new, props=dict(self.props))
        if new.discover:
            catalog.take_listing(self.listed)
        return catalog

    def model_status(self, m: ModelConfig) -> dict[str, Any]:
        """One model for the admin API: names, slots and context with where each came from,
        and a discovered model's state."""
        props = self.props.get(m.name)

        def source(configured: int | None, found: int | None) -> str:
            if configured is not None:
                return "config"
            return "props" if found else "default"

        return {
            "name": m.name,
            "upstream": m.upstream_name,
            "parallel": self.parallel(m.name),
            "parallel_source": source(m.parallel, props and props.total_slots),
            "ctx": self.ctx(m.name),
            "ctx_source": source(m.ctx, props and props.n_ctx),
            "state": self.state(m.name),
        }


@frozen
class Serving:
    """What a route's hosts serve now: its models in host then model order (`models`), and
    the hosts serving each, in route order (`hosts_of`). `listings` are the hosts' model
    tuples it was worked out from: it stands while each is the same object."""

    route: Route
    listings: tuple[tuple[ModelConfig, ...], ...]
    models: list[str]
    hosts_of: dict[str, tuple[str, ...]]

    @classmethod
    def of(cls, route: Route, listings: tuple[tuple[ModelConfig, ...], ...]) -> Serving:
        hosts: dict[str, list[str]] = {}
        for host, models in zip(route.hosts, listings, strict=True):
            for m in models:
                serving = hosts.setdefault(m.name, [])
                if not serving or serving[-1] != host:
                    serving.append(host)
        return cls(route, listings, list(hosts), {m: tuple(h) for m, h in hosts.items()})

    def candidates(self, model: str) -> tuple[str, ...]:
        """The hosts serving `model`, in route order."""
        return self.hosts_of.get(model, ())
