"""The sticky lease table and its rules: which host each conversation is on and keeping it
there (docs/reference.md, "Leases"); the chooser of new hosts, the cache truth it weighs, the
journal that carries changes to the store and keeps them through an outage. The store is behind
the `LeaseStore` protocol; hosts behind `HostStates`.
"""
