"""A fleet's dynamics and crossbar's state at scale: many hosts, flaps, expiry and bursts
(`fleet.py`, `fleet_reads.py`, `fleet_store.py`), several instances on one port (`scale.py`),
the lease table (`lease_table.py`), rebalance (`handoff.py`), usage reports (`usage_scale.py`),
the admin side beside the data path (`admin_load.py`), routes sharing a host (`fairness.py`)."""
