"""The store: SQLite or PostgreSQL through adbapi, the adapter behind the leases', hosts' and usage
recorder's protocols: lease writes and the change log, usage rows in group commits, reports and
roll-ups, heartbeats, the Batch API's files, batches and item claims, migrations, copying a store
to another database.
"""

from crossbar.store.batch_claims import Claim, Ended
from crossbar.store.batches import (
    BATCH_ENDED,
    BATCH_STATUSES,
    BatchEvent,
    BatchRow,
    BatchTally,
    Counts,
    FileRow,
    NewItem,
)
from crossbar.store.database import USAGE_GROUPS, ChangeRow, InstanceRow, Store, StoreError
from crossbar.store.rollups import RolledUp
from crossbar.store.setup import check
from crossbar.store.transfer import MigrateError, migrate_store

__all__ = [
    "BATCH_ENDED",
    "BATCH_STATUSES",
    "USAGE_GROUPS",
    "BatchEvent",
    "BatchRow",
    "BatchTally",
    "ChangeRow",
    "Claim",
    "Counts",
    "Ended",
    "FileRow",
    "InstanceRow",
    "MigrateError",
    "NewItem",
    "RolledUp",
    "Store",
    "StoreError",
    "check",
    "migrate_store",
]
