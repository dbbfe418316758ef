"""The client-facing request sequence (docs/architecture.md, "A request, step by step"): route,
dialect, model, fingerprint, lease, guard, slot, upstream, relay, usage; the valve that moves a
queued turn where it starts sooner; which models router-mode hosts have loaded, as placement
weighs them; the sites and channels that carry it, requests crossbar makes of itself (a batch's
items), CORS, and the refusals that map domain errors to HTTP. It knows the warm hand-off only
as a `TurnGate`, and the Batch API as a `BatchFront`.
"""

from crossbar.proxy.fingerprint import system_digest
from crossbar.proxy.guard import ContextGuard
from crossbar.proxy.ids import IdMemory
from crossbar.proxy.inside import InsideAnswer, InsideRequest
from crossbar.proxy.loaded import LoadedModels
from crossbar.proxy.placement import Placement
from crossbar.proxy.resource import BatchFront, ProxyResource
from crossbar.proxy.routing import choose_model
from crossbar.proxy.site import AdminSite, ProxySite
from crossbar.proxy.usage import UsageRecorder
from crossbar.proxy.valve import Valve

__all__ = [
    "AdminSite",
    "BatchFront",
    "ContextGuard",
    "IdMemory",
    "InsideAnswer",
    "InsideRequest",
    "LoadedModels",
    "Placement",
    "ProxyResource",
    "ProxySite",
    "UsageRecorder",
    "Valve",
    "choose_model",
    "system_digest",
]
