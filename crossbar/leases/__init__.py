"""The sticky lease table and its rules: which host each conversation is on and keeping it
there (docs/reference.md, "Leases"); the chooser of new hosts, the cache truth it weighs, the
journal that carries changes to the store and keeps them through an outage. The store is behind
the `LeaseStore` protocol; hosts behind `HostStates`.
"""

from crossbar.leases.chooser import EVICTS, FREE_PLACE, KEPT, LOADED, NEVER, SPARE, Chooser
from crossbar.leases.journal import DEADLINE_SLACK, Journal, StoreUnavailable
from crossbar.leases.memory import LeaseMemory
from crossbar.leases.table import Table
from crossbar.leases.types import (
    Acquired,
    Change,
    Key,
    Lease,
    LeaseError,
    NoHost,
    PinnedDown,
    State,
    Written,
)
from crossbar.leases.warmth import Warmth

__all__ = [
    "DEADLINE_SLACK",
    "EVICTS",
    "FREE_PLACE",
    "KEPT",
    "LOADED",
    "NEVER",
    "SPARE",
    "Acquired",
    "Change",
    "Chooser",
    "Journal",
    "Key",
    "Lease",
    "LeaseError",
    "LeaseMemory",
    "NoHost",
    "PinnedDown",
    "State",
    "StoreUnavailable",
    "Table",
    "Warmth",
    "Written",
]
