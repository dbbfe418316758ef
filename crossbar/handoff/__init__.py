"""Warm hand-off: a conversation moved with its prompt already in its new host's cache (the kept
bodies, the prewarm), evacuating a host, and rebalancing idle conversations off a busy one.
"""

from crossbar.handoff.evacuate import DRAINED, EVACUATED, Evacuator, Streams
from crossbar.handoff.kept import HandoffStore
from crossbar.handoff.parts import HandoffParts, build_handoff
from crossbar.handoff.rebalance import TICK

__all__ = [
    "DRAINED",
    "EVACUATED",
    "TICK",
    "Evacuator",
    "HandoffParts",
    "HandoffStore",
    "Streams",
    "build_handoff",
]
