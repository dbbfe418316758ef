"""Several crossbar instances on one store: heartbeats, who is alive, this instance's share of
each host's slots, and the follower that applies the others' changes.
"""
