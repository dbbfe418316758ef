"""The client-facing request sequence (docs/architecture.md, "A request, step by step"): route,
dialect, model, fingerprint, lease, guard, slot, upstream, relay, usage; the sites and channels
that carry it, CORS, and the refusals that map domain errors to HTTP. It knows the warm hand-off
only as a `TurnGate`.
"""
