"""The client-facing request sequence (docs/architecture.md, "A request, step by step"): route,
dialect, model, fingerprint, lease, guard, slot, upstream, relay, usage; the valve that moves a
queued turn where it starts sooner; which models router-mode hosts have loaded, as placement
weighs them; the sites and channels that carry it, CORS, and the refusals that map domain
errors to HTTP. It knows the warm hand-off
only as a `TurnGate`.
"""

from crossbar.proxy.guard import ContextGuard
from crossbar.proxy.ids import IdMemory
from crossbar.proxy.loaded import LoadedModels
from crossbar.proxy.placement import Placement
from crossbar.proxy.resource import ProxyResource
from crossbar.proxy.site import AdminSite, ProxySite
from crossbar.proxy.usage import UsageRecorder
from crossbar.proxy.valve import Valve

__all__ = [
    "AdminSite",
    "ContextGuard",
    "IdMemory",
    "LoadedModels",
    "Placement",
    "ProxyResource",
    "ProxySite",
    "UsageRecorder",
    "Valve",
]
