"""A lease remembers, in memory only, that it came to its host by a move and whether another
instance wrote it: what the valve's hold reads."""

from crossbar.leases import Key, Lease, LeaseMemory, State
from crossbar.leases.types import pin_key

KEY = Key("convo", "f1", "m")


def lease(host: str, created: float) -> Lease:
    return Lease(KEY, host, State.ACTIVE, created=created, last_used=created)


def test_another_instances_move_is_a_move_written_elsewhere():
    memory = LeaseMemory()
    memory.adopt(KEY, lease("titan", 1.0), 1)
    first = memory.index.get(KEY)
    assert first is not None and first.remote and not first.moved  # born elsewhere
    memory.adopt(KEY, lease("atlas", 5.0), 2)
    moved = memory.index.get(KEY)
    assert moved is not None and moved.moved and moved.remote


def test_a_touch_from_elsewhere_keeps_the_move_it_followed():
    memory = LeaseMemory()
    memory.adopt(KEY, lease("titan", 1.0), 1)
    memory.adopt(KEY, lease("atlas", 5.0), 2)
    touched = lease("atlas", 5.0)
    touched.last_used = 30.0
    memory.adopt(KEY, touched, 3)
    held = memory.index.get(KEY)
    assert held is not None and held.moved and held.last_used == 30.0


def test_a_pin_from_elsewhere_is_only_a_pin():
    memory = LeaseMemory()
    row = Lease(pin_key("convo"), "titan", State.PINNED, created=1.0, last_used=1.0)
    memory.adopt(pin_key("convo"), row, 1)
    assert memory.pinned("convo") == "titan" and len(memory.index) == 0
