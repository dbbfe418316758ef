"""Health probes spread over `health_interval`: each host at its own phase, never all at once.

Probing every host in one round made a burst of connections, parses and callbacks once per
interval: with 200 hosts at 1 s it held the reactor for 40-140 ms each second, and every
proxied request that arrived meanwhile waited. Here each host has its own timer: its first
probe comes at a fixed phase of the interval, one of SLOTS (from a hash of its name, so hosts
scatter evenly over them and stay put across restarts and reloads), and each next one
`health_interval` after
the previous one started, or as soon as it ended when it took longer (a host is never probed
twice at once). The start-up round (`Hosts.probe_all`) still probes every host at once, as
the proxy port waits for it.
"""

from __future__ import annotations

import hashlib
from typing import Any

from twisted.application.service import Service
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from crossbar.config import Config
from crossbar.hosts.registry import Hosts

# Probes start in this many groups per interval: a host at a time would wake the reactor for
# every probe (200 a second at 200 hosts and 1 s), which costs more than the probes under load.
SLOTS = 20


def phase(name: str) -> float:
    """Where in the interval the host's probes fall: one of SLOTS fractions in [0, 1), fixed
    per name (a hash of it, so hosts scatter evenly over the slots)."""
    digest = hashlib.sha256(name.encode()).digest()
    return (int.from_bytes(digest[:8], "big") % SLOTS) / SLOTS


class ProbeSchedule(Service):
    """Probes each host of `hosts` every `health_interval` at its own phase on `clock`."""

    name = "probes"

    def __init__(self, config: Config, hosts: Hosts, clock: IReactorTime) -> None:
        self._hosts = hosts
        self._clock = clock
        self.interval = config.server.health_interval
        self._calls: dict[str, IDelayedCall] = {}
        self._probing: set[str] = set()

    def startService(self) -> None:
        super().startService()
        for name in self._hosts.names():
            self._first(name)

    def stopService(self) -> Any:
        super().stopService()
        for call in self._calls.values():
            if call.active():
                call.cancel()
        self._calls.clear()

    def reconfigure(self, config: Config) -> None:
        """A new interval or host list: every host starts again at its phase of it."""
        self.interval = config.server.health_interval
        if not self.running:
            return
        for call in self._calls.values():
            if call.active():
                call.cancel()
        self._calls.clear()
        for name in self._hosts.names():
            if name not in self._probing:  # one under way schedules its next itself
                self._first(name)

    def _first(self, name: str) -> None:
        self._at(name, self.interval * phase(name))

    def _at(self, name: str, delay: float) -> None:
        due = self._clock.seconds() + delay
        self._calls[name] = self._clock.callLater(delay, self._probe, name, due)

    def _probe(self, name: str, due: float) -> None:
        self._calls.pop(name, None)
        self._probing.add(name)

        def done(_: object) -> None:
            self._probing.discard(name)
            if self.running and name in self._hosts.names() and name not in self._calls:
                # From when it was due, not when the timer fired: no drift from late timers.
                self._at(name, max(0.0, due + self.interval - self._clock.seconds()))

        self._hosts.probe(name).addBoth(done)
