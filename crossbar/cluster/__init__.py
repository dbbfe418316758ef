"""Several crossbar instances on one store: heartbeats, who is alive, this instance's share of
each host's slots, and the follower that applies the others' changes.
"""

from crossbar.cluster.follower import FOLLOW_EVERY, Follower
from crossbar.cluster.instances import Instances, KeyShare, SharedSlots

__all__ = ["FOLLOW_EVERY", "Follower", "Instances", "KeyShare", "SharedSlots"]
