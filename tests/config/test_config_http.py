"""The `[server]` keys that bound what clients may hold on the HTTP ports: the memory of request
bodies held at once, a body's whole deadline, the listen backlog; read with their units, every
error by its dotted path."""

import pytest

from crossbar.config.values import ConfigError, ServerConfig, parse_config

HOSTS = {"titan": {"url": "http://10.0.0.5:8080", "models": ["qwen-coder"]}}


def server(**keys) -> ServerConfig:
    return parse_config({"server": keys, "hosts": HOSTS}).server


def test_the_defaults():
    s = server()
    assert s.max_body_memory == 256 * 1024 * 1024
    assert s.body_deadline == 60.0
    assert s.listen_backlog == 1024


def test_the_keys_are_read_with_their_units():
    s = server(max_body_memory="1GiB", body_deadline="2m", listen_backlog=4096)
    assert (s.max_body_memory, s.body_deadline, s.listen_backlog) == (2**30, 120.0, 4096)


@pytest.mark.parametrize(
    ("keys", "error"),
    [
        (
            {"max_body_memory": "lots"},
            'server.max_body_memory: "lots" is not a size (use e.g. "512KiB", "64MiB", "1GiB")',
        ),
        ({"max_body_memory": 0}, "server.max_body_memory: must be larger than zero, not 0"),
        (
            {"max_body_memory": "32MiB"},
            'server.max_body_memory: must be at least max_body ("64MiB"), not "32MiB"',
        ),
        (
            {"max_body": "1GiB", "max_body_memory": "512MiB"},
            'server.max_body_memory: must be at least max_body ("1GiB"), not "512MiB"',
        ),
        ({"body_deadline": "0s"}, 'server.body_deadline: must be longer than zero, not "0s"'),
        (
            {"body_deadline": 60},
            'server.body_deadline: must be a duration string such as "90s", not an integer 60',
        ),
        ({"listen_backlog": 0}, "server.listen_backlog: must be at least 1, not 0"),
    ],
)
def test_bad_values_are_reported_by_their_dotted_path(keys, error):
    with pytest.raises(ConfigError) as info:
        parse_config({"server": keys, "hosts": HOSTS})
    assert any(line.startswith(error) for line in info.value.errors), info.value.errors


def test_a_bad_max_body_is_not_also_reported_against_max_body_memory():
    with pytest.raises(ConfigError) as info:
        parse_config({"server": {"max_body": "lots", "max_body_memory": "1MiB"}, "hosts": HOSTS})
    assert [line.split(":")[0] for line in info.value.errors] == ["server.max_body"]
