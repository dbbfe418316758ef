"""OpenTelemetry traces of crossbar's requests and moves, with the GenAI conventions: spans,
W3C trace context in and out, export off the reactor thread. Optional: nothing here imports
OpenTelemetry until a config with `[tracing]` builds it (`build_tracing`); the GenAI names
(`genai.py`) need no extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from crossbar.config import Config
from crossbar.tracing.genai import operation

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from crossbar.tracing.spans import RequestTrace, Tracing


def build_tracing(config: Config, clock: Any, registry: CollectorRegistry) -> Tracing | None:
    """crossbar's tracing as `config.tracing` says, its counts on `registry`; None (and no
    OpenTelemetry import) when the config has no `[tracing]`."""
    if config.tracing is None:
        return None
    from crossbar.tracing.setup import build_tracing as build

    return build(config.tracing, clock, registry)


__all__ = ["RequestTrace", "Tracing", "build_tracing", "operation"]
