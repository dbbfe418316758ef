"""Per-(host, model) request slots and their fairly shared queues: priorities, weights, per-route
caps, and the release rule of docs/reference.md, "Slots".
"""

from crossbar.limiter.slots import (
    Limiter,
    LimiterError,
    QueueFull,
    QueueTimeout,
    Release,
    RouteQueueFull,
    RouteState,
)

__all__ = [
    "Limiter",
    "LimiterError",
    "QueueFull",
    "QueueTimeout",
    "Release",
    "RouteQueueFull",
    "RouteState",
]
