"""Per-(host, model) request slots and their fairly shared queues: priorities, weights, per-route
caps, and the release rule of docs/reference.md, "Slots"; each host's learned prefill and decode
rates, and the expected wait they give.
"""

from crossbar.limiter.slots import (
    Limiter,
    LimiterError,
    QueueFull,
    QueueTimeout,
    Rates,
    Release,
    RouteQueueFull,
    RouteState,
    Work,
)

__all__ = [
    "Limiter",
    "LimiterError",
    "QueueFull",
    "QueueTimeout",
    "Rates",
    "Release",
    "RouteQueueFull",
    "RouteState",
    "Work",
]
