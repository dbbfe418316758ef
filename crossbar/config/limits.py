"""How routes share the slot queues: a route's limits, and the ranges the config allows.

A route's `priority` orders waiters of one (host, model): a higher one is admitted before every
lower one. Within a priority, routes that set `weight` get a line of their own and share
admissions in proportion to their weights; routes that leave it out share one FIFO line (today's
order) that counts as weight 1. `max_in_flight` caps a route's requests over all hosts;
`max_queued` bounds its waiters per (host, model); `batch_slots` the slots of a (host, model)
its batch requests may hold.
"""

from __future__ import annotations

from attrs import frozen

PRIORITY_MIN = -100
PRIORITY_MAX = 100
# Below every route's priority: kept free for a later prewarm (warm hand-off), which must rank
# below every client request. The config never lets a route reach it.
PREWARM_PRIORITY = PRIORITY_MIN - 1
# Weights far apart or tiny would make the fair queue's tags grow by huge steps (1 / weight).
WEIGHT_MIN = 0.001
WEIGHT_MAX = 1000.0


@frozen
class RouteLimits:
    """One route's share of the slot queues. The defaults are today's behaviour: priority 0,
    the shared FIFO line, no cap on requests in flight, the server's `queue_max` as its bound."""

    name: str = ""
    priority: int = 0
    weight: float | None = None  # None: the shared FIFO line of its priority (weight 1)
    max_in_flight: int | None = None  # None: unlimited
    max_queued: int | None = None  # None: the server's queue_max
    # The most slots of a (host, model) its batch requests may hold; None: what the turns
    # leave (limiter/reserve.py `batch_cap`).
    batch_slots: int | None = None

    def queued_bound(self, queue_max: int) -> int:
        """The most waiters this route may have per (host, model)."""
        return queue_max if self.max_queued is None else self.max_queued

    def below_cap(self, in_flight: int) -> bool:
        """Whether one more request of the route may be in flight."""
        return self.max_in_flight is None or in_flight < self.max_in_flight


DEFAULT_LIMITS = RouteLimits()
