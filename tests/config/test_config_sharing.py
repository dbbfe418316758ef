"""The route keys that share the slot queues: priority, weight, max_in_flight, max_queued."""

import pytest

from crossbar.config.limits import PREWARM_PRIORITY, PRIORITY_MAX, PRIORITY_MIN, RouteLimits
from crossbar.config.values import ConfigError, parse_config

HOSTS = {"titan": {"url": "http://10.0.0.5:8080", "models": ["qwen-coder"], "parallel": 4}}


def route(**keys):
    c = parse_config({"hosts": HOSTS, "routes": {"r": {"hosts": ["titan"], **keys}}})
    return c.route("r")


def errors_of(**keys) -> list[str]:
    with pytest.raises(ConfigError) as info:
        route(**keys)
    return info.value.errors


def test_defaults_keep_todays_behaviour_priority_zero_shared_line_no_caps():
    r = route()
    assert (r.priority, r.weight, r.max_in_flight, r.max_queued) == (0, None, None, None)
    assert r.limits == RouteLimits(name="r")


def test_the_four_keys_are_read_and_carried_in_the_routes_limits():
    r = route(priority=2, weight=3, max_in_flight=8, max_queued=16)
    assert r.limits == RouteLimits(name="r", priority=2, weight=3.0, max_in_flight=8, max_queued=16)
    assert route(weight=0.5).weight == 0.5


def test_setting_weight_to_one_is_not_the_same_as_leaving_it_out():
    # weight = 1 gives the route a line of its own; no weight keeps it in the shared FIFO line.
    assert route(weight=1).limits.weight == 1.0
    assert route().limits.weight is None


def test_a_template_carries_the_keys_to_every_route_it_serves():
    c = parse_config(
        {
            "hosts": HOSTS,
            "templates": {
                "batch": {"match": "batch-*", "hosts": ["titan"], "priority": -1, "weight": 2}
            },
        }
    )
    limits = c.route("batch-evals").limits
    assert (limits.name, limits.priority, limits.weight) == ("batch-evals", -1, 2.0)


def test_the_prewarm_floor_is_below_every_priority_a_route_may_have():
    assert PREWARM_PRIORITY < PRIORITY_MIN < 0 < PRIORITY_MAX
    assert route(priority=PRIORITY_MIN).priority == PRIORITY_MIN
    assert errors_of(priority=PREWARM_PRIORITY) == [
        f"routes.r.priority: must be at least {PRIORITY_MIN}, not {PREWARM_PRIORITY}"
    ]


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"priority": 1.5}, "routes.r.priority: must be an integer, not a number"),
        ({"priority": True}, "routes.r.priority: must be an integer, not a boolean"),
        ({"priority": 101}, "routes.r.priority: must be at most 100, not 101"),
        ({"weight": 0}, "routes.r.weight: must be larger than zero, not 0"),
        ({"weight": -2.5}, "routes.r.weight: must be larger than zero, not -2.5"),
        ({"weight": "3"}, 'routes.r.weight: must be a number, not a string "3"'),
        ({"weight": True}, "routes.r.weight: must be a number, not a boolean true"),
        ({"weight": float("inf")}, "routes.r.weight: must be at most 1000, not inf"),
        ({"weight": float("nan")}, "routes.r.weight: must be a number, not nan"),
        ({"weight": 0.0001}, "routes.r.weight: must be at least 0.001, not 0.0001"),
        ({"max_in_flight": 0}, "routes.r.max_in_flight: must be at least 1, not 0"),
        ({"max_in_flight": -1}, "routes.r.max_in_flight: must be at least 1, not -1"),
        ({"max_in_flight": "4"}, "routes.r.max_in_flight: must be an integer, not a string"),
        ({"max_queued": -1}, "routes.r.max_queued: must be at least 0, not -1"),
    ],
    ids=lambda v: str(v) if isinstance(v, dict) else None,
)
def test_each_bad_value_is_reported_under_its_dotted_path(keys, message):
    assert errors_of(**keys) == [message]


def test_max_queued_zero_means_the_route_never_waits():
    assert route(max_queued=0).max_queued == 0


@pytest.mark.parametrize("key", ["priority", "weight", "max_in_flight", "max_queued"])
def test_a_route_that_never_queues_rejects_every_queue_key(key):
    assert errors_of(queue=False, **{key: 1}) == [f"routes.r.{key}: needs queue = true"]


def test_template_errors_name_the_template():
    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "hosts": HOSTS,
                "templates": {
                    "batch": {"match": "b-*", "hosts": ["titan"], "weight": 0, "queue": False}
                },
            }
        )
    assert info.value.errors == [
        "templates.batch.weight: must be larger than zero, not 0",
        "templates.batch.weight: needs queue = true",
    ]


def test_batch_yields_after_200ms_unless_a_route_says_otherwise_or_false():
    assert route().batch_yield_after == 0.2
    assert route(batch_yield_after="2s").batch_yield_after == 2.0
    assert route(batch_yield_after=False).batch_yield_after is None  # never


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0s", 'must be longer than zero (false: never), not "0s"'),
        (True, 'must be a duration string such as "200ms", or false, not a boolean true'),
        (5, 'must be a duration string such as "200ms", or false, not an integer 5'),
    ],
)
def test_a_bad_batch_yield_after_is_reported_under_its_dotted_path(value, message):
    assert errors_of(batch_yield_after=value) == [f"routes.r.batch_yield_after: {message}"]
