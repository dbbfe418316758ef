"""Completion ids are remembered with their host, bounded in number and in time."""

from crossbar.config.values import parse_config
from crossbar.proxy.ids import IdMemory


def config_without_titan(**server):
    hosts = {"atlas": {"url": "http://atlas:8080", "models": ["m"]}}
    return parse_config({"server": server, "hosts": hosts})


def test_a_remembered_id_names_its_host_and_conversation():
    ids = IdMemory(size=10, ttl=60)
    ids.remember(["chatcmpl-1"], "titan", "fp1", now=0)
    origin = ids.lookup("chatcmpl-1", now=30)
    assert (origin.host, origin.fp) == ("titan", "fp1")
    assert ids.lookup("chatcmpl-2", now=30) is None


def test_an_id_is_forgotten_after_its_ttl():
    ids = IdMemory(size=10, ttl=60)
    ids.remember(["a"], "titan", "", now=0)
    assert ids.lookup("a", now=61) is None
    assert len(ids) == 0


def test_the_least_recently_remembered_id_goes_first_when_full():
    ids = IdMemory(size=2, ttl=60)
    ids.remember(["a"], "titan", "", now=0)
    ids.remember(["b"], "titan", "", now=1)
    ids.remember(["a"], "atlas", "", now=2)  # seen again: now the newest
    ids.remember(["c"], "titan", "", now=3)
    assert ids.lookup("b", now=3) is None
    assert ids.lookup("a", now=3).host == "atlas"
    assert ids.lookup("c", now=3) is not None


def test_a_size_of_zero_remembers_nothing():
    ids = IdMemory(size=0, ttl=60)
    ids.remember(["a"], "titan", "", now=0)
    assert ids.lookup("a", now=0) is None


def test_a_reload_without_a_host_drops_its_ids():
    ids = IdMemory(size=10, ttl=60)
    ids.remember(["a"], "titan", "", now=0)
    ids.remember(["b"], "atlas", "", now=0)
    ids.reconfigure(config_without_titan())
    assert ids.lookup("a", now=0) is None
    assert ids.lookup("b", now=0) is not None


def test_a_reload_takes_the_new_size_and_ttl():
    ids = IdMemory(size=10, ttl=60)
    for i in range(5):
        ids.remember([str(i)], "atlas", "", now=i)
    ids.reconfigure(config_without_titan(remember_ids=2, lease_idle="10s"))
    assert [ids.lookup(str(i), now=5) is not None for i in range(5)] == [False] * 3 + [True] * 2
    assert ids.lookup("4", now=15) is None  # the new ttl
