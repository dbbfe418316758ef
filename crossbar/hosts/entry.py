"""One configured host as the registry keeps it: its config, health, flap record and catalog."""

from __future__ import annotations

from attrs import define, field

from crossbar.config import HostConfig
from crossbar.hosts.catalog import Catalog
from crossbar.hosts.flaps import Flaps
from crossbar.hosts.health import Health
from crossbar.hosts.residency import Residency


@define
class HostEntry:
    """A host of the registry (registry.py): what it is configured as and what was seen of it;
    a router-mode host's loaded models in `residency` (None for any other)."""

    config: HostConfig
    health: Health = field(factory=Health)
    flaps: Flaps = field(factory=Flaps)
    catalog: Catalog = field()

    @catalog.default
    def _catalog(self) -> Catalog:
        return Catalog(self.config)

    residency: Residency | None = field()

    @residency.default
    def _residency(self) -> Residency | None:
        return fresh_residency(self.config)


def fresh_residency(config: HostConfig) -> Residency | None:
    """What a router-mode host has loaded, before anything was seen of it."""
    return Residency(config.name, config.max_loaded) if config.discover else None
