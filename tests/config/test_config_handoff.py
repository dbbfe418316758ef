"""The warm hand-off's keys: sizes and durations read as the other keys are, errors by path."""

from tests.config.test_config import config, errors_of


def test_the_hand_off_is_off_by_default_and_its_keys_take_their_spec_units():
    s = config().server
    assert (s.handoff_store, s.prewarm_parallel, s.prewarm_timeout) == (0, 1, 30.0)
    server = {"handoff_store": "1GiB", "handoff_max_body": "8MiB", "prewarm_parallel": 2,
              "prewarm_timeout": "90s"}  # fmt: skip
    s = config(server=server).server
    assert (s.handoff_store, s.handoff_max_body) == (1 << 30, 8 << 20)
    assert (s.prewarm_parallel, s.prewarm_timeout) == (2, 90.0)
    assert config(server={"handoff_store": 0}).server.handoff_store == 0
    assert config(server={"handoff_store": "0"}).server.handoff_store == 0


def test_rebalance_is_a_route_key_with_its_defaults():
    route = config(routes={"convo": {"hosts": ["titan"]}}).routes["convo"]
    assert not route.rebalance
    assert (route.rebalance_after, route.rebalance_idle, route.rebalance_per_minute) == (
        30.0, 20.0, 10,
    )  # fmt: skip


def test_bad_hand_off_keys_are_named_by_their_dotted_paths():
    data = {
        "server": {"handoff_store": "lots", "prewarm_parallel": 0, "prewarm_timeout": 5},
        "hosts": {"titan": {"url": "http://127.0.0.1:1", "models": ["m"]}},
        "routes": {"convo": {"hosts": ["titan"], "rebalance": "yes",
                             "rebalance_after": "0s", "rebalance_per_minute": -1}},
    }  # fmt: skip
    found = errors_of(data)
    for path in (
        "server.handoff_store",
        "server.prewarm_parallel",
        "server.prewarm_timeout",
        "routes.convo.rebalance",
        "routes.convo.rebalance_after",
        "routes.convo.rebalance_per_minute",
    ):
        assert any(e.startswith(path + ":") for e in found), (path, found)
