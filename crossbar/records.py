"""Plain records the store keeps and other parts of crossbar write: lease events, usage rows."""

from __future__ import annotations

from attrs import frozen


@frozen
class LeaseEvent:
    """One lease change: a lease born, moved, dropped, or a route pinned/unpinned.

    `from_host`/`to_host` are "" when there is no such host (a new lease has no `from_host`,
    a dropped one no `to_host`). `reason` is one of new, idle, pin, release, unhealthy, config,
    evacuate, rebalance, cold (an evicted conversation placed again), busy (moved by the valve
    off a host where its turn would have waited), refused (a lease whose
    first request was refused, forgotten).
    """

    at: float
    route: str
    fp: str
    model: str
    from_host: str
    to_host: str
    reason: str


@frozen
class UsageRow:
    """One request as the proxy saw it: where it went, what it cost, how long it took."""

    at: float
    route: str
    fp: str
    model: str
    host: str
    path: str
    status: int
    stream: bool
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    queue_ms: float | None = None
    ttfb_ms: float | None = None
    duration_ms: float | None = None
    lease: str = ""  # the X-Crossbar-Lease value: new, reused, pinned or moved
    error: str = ""  # what went wrong, "" when nothing did
    key: str = ""  # the named client key's name ("" for none or an anonymous key); never a secret
    # The route the request came for when a fallback route served it (`route`), and why it
    # fell back (proxy/fallback.py REASONS); "" when its own route served it.
    fallback_from: str = ""
    fallback_reason: str = ""
    # The request class it ran at (interactive, standard, batch); "" for a request that is
    # not inference, or was refused before its class was known.
    request_class: str = ""
    # Times its answer moved to another host and went on there (docs/reference.md, "Answers
    # that survive their host"): a stream continued, or an answer that showed nothing run again.
    resumed: int = 0
