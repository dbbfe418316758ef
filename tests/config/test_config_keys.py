"""`[keys.<name>]`: a named client key's secret is hashed as the file is read (the config holds
no secret), its scope and limits are checked with dotted paths, and `auth = "keys"` asks a route
for named keys."""

import datetime as dt
import hashlib

import pytest

from crossbar.cli.check import describe
from crossbar.config.values import ConfigError, parse_config

SECRET = "sk-dev-alice-2b1f8c0e9d"


def config(keys=None, routes=None, server=None):
    return parse_config(
        {
            "server": {"db": ":memory:", **(server or {})},
            "hosts": {"titan": {"url": "http://127.0.0.1:9", "models": ["qwen-coder"]}},
            "routes": routes or {"team": {"hosts": ["titan"], "auth": "keys"}},
            "templates": {"proj": {"match": "proj-*", "hosts": ["titan"]}},
            "keys": keys or {},
        }
    )


def errors(**kw) -> list[str]:
    with pytest.raises(ConfigError) as e:
        config(**kw)
    return e.value.errors


def test_a_key_keeps_the_hash_of_its_secret_and_never_the_secret():
    c = config({"alice": {"secret": SECRET, "routes": ["team", "proj-*"], "tpm": 1000}})
    alice = c.keys["alice"]
    assert alice.sha256 == hashlib.sha256(SECRET.encode()).hexdigest()
    assert SECRET not in repr(c) and SECRET not in repr(alice) and SECRET not in describe(c)
    assert alice.limits.tpm == 1000 and alice.limits.cached_weight == 0.1
    assert c.route("team").needs_key and c.route("team").auth == "keys"


def test_secret_sha256_names_the_hash_itself():
    digest = hashlib.sha256(b"whatever-the-secret-is").hexdigest()
    c = config({"ci": {"secret_sha256": digest.upper(), "routes": ["team"]}})
    assert c.keys["ci"].sha256 == digest


def test_expiry_is_a_toml_date_a_date_time_or_an_iso_string_in_utc():
    day = dt.date(2027, 1, 31)
    at = dt.datetime(2027, 1, 31, 12, 0, tzinfo=dt.UTC)
    c = config(
        {
            "a": {"secret": SECRET + "a", "routes": ["team"], "expires": day},
            "b": {"secret": SECRET + "b", "routes": ["team"], "expires": at},
            "c": {"secret": SECRET + "c", "routes": ["team"], "expires": "2027-01-31T12:00:00Z"},
        }
    )
    assert c.keys["a"].expires == dt.datetime(2027, 1, 31, tzinfo=dt.UTC).timestamp()
    assert c.keys["b"].expires == c.keys["c"].expires == at.timestamp()


def test_every_mistake_is_named_by_its_dotted_path_and_no_secret_is_repeated():
    found = errors(
        keys={
            "alice": {"secret": "short", "routes": ["nope"], "tpm": 0, "cached_weight": 2},
            "bob": {"routes": ["team"]},
            "carol": {"secret": SECRET, "secret_sha256": "0" * 64, "routes": ["team"]},
            "dave": {"secret_sha256": "xyz", "routes": ["team"], "expires": "soon"},
            "Eve": {"secret": SECRET + "e", "routes": ["team"], "colour": "red"},
            "frank": {"secret": SECRET + "e", "routes": ["team"]},
        },
        routes={"team": {"hosts": ["titan"], "auth": "key"}},
        server={"metrics_keys": ["Zed"]},
    )
    assert found == [
        'routes.team.auth: must be "keys" (named client keys), not "key"',
        "keys.alice.secret: must be a string of at least 16 characters",
        "keys.alice.tpm: must be at least 1, not 0",
        "keys.alice.cached_weight: must be a number from 0 to 1, not 2",
        'keys.bob.secret: missing (secret = "...", or secret_sha256 = the hex SHA-256 of the '
        "secret)",
        "keys.carol.secret: give exactly one of secret and secret_sha256",
        "keys.dave.secret_sha256: must be 64 hex digits (a SHA-256)",
        'keys.dave.expires: must be a date or date-time such as 2027-01-31, not "soon"',
        'keys.Eve: bad key name "Eve" (use [a-z0-9][a-z0-9._-]{0,63})',
        "keys.Eve.colour: unknown key",
        "keys.frank.secret: is the same secret as keys.Eve",
        'keys.alice.routes[0]: unknown route "nope"',
        'server.metrics_keys[0]: "Zed" is not a key name',
    ]
    assert not any("short" in line or SECRET in line for line in found)


def test_a_glob_of_routes_need_not_match_a_route_yet():
    c = config({"ops": {"secret": SECRET, "routes": ["staging-*"]}})
    assert c.keys["ops"].routes == ("staging-*",)


def test_crossbar_check_shows_keys_scope_and_limits_only():
    c = config(
        {
            "ci": {
                "secret": SECRET,
                "routes": ["team"],
                "models": ["qwen-*"],
                "tokens_per_day": 50000,
                "expires": dt.date(2027, 6, 30),
            }
        }
    )
    text = describe(c)
    assert "ci: routes team; models qwen-*; tokens_per_day 50000; cached_weight 0.1; " in text
    assert "expires 2027-06-30 00:00:00Z" in text
    assert "team: hosts titan" in text and "auth named keys" in text
    assert SECRET not in text and c.keys["ci"].sha256 not in text
