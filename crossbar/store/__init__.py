"""The store: SQLite or PostgreSQL through adbapi, the adapter behind the leases', hosts' and usage
recorder's protocols: lease writes and the change log, usage rows in group commits, reports and
roll-ups, heartbeats, migrations, copying a store to another database.
"""
