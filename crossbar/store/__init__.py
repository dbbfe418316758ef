"""The store: SQLite or PostgreSQL through adbapi, the adapter behind the leases', hosts' and usage
recorder's protocols: lease writes and the change log, usage rows in group commits, reports and
roll-ups, heartbeats, migrations, copying a store to another database.
"""

from crossbar.store.database import USAGE_GROUPS, ChangeRow, InstanceRow, Store, StoreError
from crossbar.store.rollups import RolledUp
from crossbar.store.setup import check
from crossbar.store.transfer import MigrateError, migrate_store

__all__ = [
    "USAGE_GROUPS",
    "ChangeRow",
    "InstanceRow",
    "MigrateError",
    "RolledUp",
    "Store",
    "StoreError",
    "check",
    "migrate_store",
]
