"""What the test stories share: crossbar on real sockets in front of fakes (harness,
admin_harness, fleet), on an in-memory network (memnet), fakes of its parts (lease_fakes,
fake_hosts), databases (pg, db_gate), a browser, and the oracles of the property tests."""
