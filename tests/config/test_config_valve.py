"""The valve's route keys: on by default, tunable, and refused where it can never open."""

import pytest

from crossbar.config.values import ConfigError, parse_config

HOSTS = {"titan": {"url": "http://titan:8080", "models": ["m"]}}


def route(**keys):
    config = parse_config({"hosts": HOSTS, "routes": {"r": {"hosts": ["titan"], **keys}}})
    return config.routes["r"]


def errors_of(**keys):
    with pytest.raises(ConfigError) as info:
        route(**keys)
    return info.value.errors


def test_the_valve_is_on_by_default_with_its_documented_tuning():
    r = route()
    assert (r.valve, r.valve_margin, r.valve_slack, r.valve_hold) == (True, 1.0, 0.25, 60.0)
    assert r.valves()


def test_every_valve_key_is_read():
    r = route(valve_margin=2, valve_slack="0s", valve_hold="2m")
    assert (r.valve_margin, r.valve_slack, r.valve_hold) == (2.0, 0.0, 120.0)
    assert not route(valve=False).valves()


def test_a_margin_below_one_would_move_turns_to_slower_hosts():
    assert errors_of(valve_margin=0.5) == ["routes.r.valve_margin: must be at least 1, not 0.5"]


def test_a_bare_number_is_no_duration():
    assert errors_of(valve_slack=1) == [
        'routes.r.valve_slack: must be a duration string such as "90s", not an integer 1'
    ]


@pytest.mark.parametrize("key, value", [("valve", True), ("valve_margin", 2), ("valve_hold", "1m")])
def test_a_valve_on_a_route_that_never_queues_is_refused(key, value):
    assert errors_of(queue=False, **{key: value}) == [
        f"routes.r.{key}: needs queue = true (the valve moves queued conversations)"
    ]


def test_a_valve_on_a_route_with_one_lease_is_refused():
    assert errors_of(affinity="route", valve_slack="1s") == [
        'routes.r.valve_slack: needs affinity = "conversation" (the valve moves queued '
        "conversations)"
    ]


def test_turning_the_valve_off_is_always_allowed():
    assert not route(queue=False, valve=False).valves()
    assert not route(affinity="route").valves()
