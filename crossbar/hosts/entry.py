"""One configured host as the registry keeps it: its config, health, flap record and catalog."""

from __future__ import annotations

from attrs import define, field

from crossbar.config import HostConfig
from crossbar.hosts.catalog import Catalog
from crossbar.hosts.flaps import Flaps
from crossbar.hosts.health import Health


@define
class HostEntry:
    """A host of the registry (registry.py): what it is configured as and what was seen of it."""

    config: HostConfig
    health: Health = field(factory=Health)
    flaps: Flaps = field(factory=Flaps)
    catalog: Catalog = field()

    @catalog.default
    def _catalog(self) -> Catalog:
        return Catalog(self.config)
