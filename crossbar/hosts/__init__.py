"""The fleet of llama-servers: the registry of configured hosts with their health (probes and
passive failures), draining, flap damping, what each serves (configured or discovered) with its
slots and context, and the spread probe schedule; a router-mode host's loaded models, their
loads and unloads, and its own API to load and unload them; and how a llama-server's `/props`,
`/models` and error answers are read (which `crossbar init` reads too).
"""

from crossbar.hosts.health import Props, parse_models, parse_props, status_reason
from crossbar.hosts.registry import Hosts, NoSuchHost
from crossbar.hosts.residency import (
    FAILED,
    LOADING,
    REQUEST,
    RUNNING,
    SWAP,
    ModelEvent,
    Residency,
)
from crossbar.hosts.router import NotARouter, RouterRefused, UnknownModel
from crossbar.hosts.schedule import ProbeSchedule

__all__ = [
    "FAILED",
    "LOADING",
    "REQUEST",
    "RUNNING",
    "SWAP",
    "Hosts",
    "ModelEvent",
    "NoSuchHost",
    "NotARouter",
    "ProbeSchedule",
    "Props",
    "Residency",
    "RouterRefused",
    "UnknownModel",
    "parse_models",
    "parse_props",
    "status_reason",
]
