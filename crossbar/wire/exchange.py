"""One exchange between a client and a host as crossbar learns it, step by step: the record a
usage row is made from (proxy/usage.py), written by the proxy and by prewarms."""

from __future__ import annotations

from typing import Any

from attrs import define, field

from crossbar.wire.meter import Tokens


@define
class Exchange:
    """One request as the proxy learns it, step by step; only the proxy writes it."""

    started: float
    route: str = ""  # "" until the route is known; UNKNOWN_ROUTE on a refusal before it
    path: str = ""
    fp: str = ""
    model: str = ""
    host: str = ""
    lease: str = ""  # the X-Crossbar-Lease value: new, reused, pinned or moved
    prompt_chars: int = 0  # for the guard's learned ratio
    queue_ms: float = 0.0
    status: int = 0
    stream: bool = False
    first_byte: float | None = None  # clock seconds of the first answer byte
    tokens: Tokens = field(factory=Tokens)
    error: str = ""
    key: str = ""  # the named client key that sent it ("" none)
    # Set when a fallback route serves it (`route` is then that route): the route it came
    # for, and why that one could not serve it.
    fallback_from: str = ""
    fallback_reason: str = ""
    request_class: str = ""  # the class it ran at (proxy/classes.py); "" for no inference
    # Each time the answer moved to another host, or was not moved (proxy/resume.py Resume).
    resumes: list[Any] = field(factory=list)
    # The request's spans (tracing.RequestTrace) when tracing is on; None costs nothing.
    trace: Any = None
