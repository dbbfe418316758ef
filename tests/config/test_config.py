"""The config of docs/reference.md, "Config": defaults, routes and templates, and every error by its dotted path."""

import pytest

from crossbar.config.values import ConfigError, ServerConfig, parse_config

HOSTS = {
    "titan": {"url": "http://10.0.0.5:8080", "models": ["qwen-coder"], "parallel": 4},
    "atlas": {
        "url": "https://10.0.0.6:8443/",
        "models": {"qwen-coder": {"upstream": "Qwen3-Coder", "parallel": 2, "ctx": 65536}},
    },
}


def config(**sections):
    data = {"hosts": HOSTS, **sections}
    return parse_config(data)


def errors_of(data) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value.errors


def test_an_empty_server_table_takes_every_default_of_the_spec():
    s = config().server
    assert s == ServerConfig()
    assert (s.listen, s.admin_listen, s.admin_token, s.db) == (
        "tcp:8080",
        "tcp:8081:interface=127.0.0.1",
        "",
        "crossbar.db",
    )
    assert s.default_route == ""
    assert (s.lease_idle, s.sweep_interval) == (7200.0, 30.0)
    assert (s.health_interval, s.health_timeout) == (5.0, 2.0)
    assert (s.unhealthy_after, s.healthy_after) == (3, 2)
    assert (s.queue_max, s.queue_timeout) == (64, 300.0)
    assert s.max_body == 64 * 1024 * 1024
    assert (s.upstream_connect_timeout, s.upstream_idle_timeout) == (5.0, 600.0)
    assert (s.upstream_max_connections, s.upstream_connect_queue_timeout) == (256, 10.0)
    assert s.fingerprint_chars == 4096
    assert (s.usage_retention, s.events_retention) == (30 * 86400.0, 30 * 86400.0)
    assert s.shutdown_grace == 30.0
    assert s.remember_ids == 100_000


def test_server_keys_are_read_with_their_units():
    s = config(
        server={"lease_idle": "90m", "max_body": "1MiB", "queue_max": 0, "shutdown_grace": "0s"}
    ).server
    assert (s.lease_idle, s.max_body, s.queue_max, s.shutdown_grace) == (5400.0, 2**20, 0, 0.0)


def test_a_host_with_a_model_list_applies_its_parallel_and_ctx_to_each_model():
    titan = config().hosts["titan"]
    (model,) = titan.models
    assert (model.name, model.upstream_name, model.parallel, model.ctx) == (
        "qwen-coder",
        "qwen-coder",
        4,
        None,
    )


def test_a_host_with_a_model_table_carries_upstream_name_parallel_and_ctx():
    atlas = config().hosts["atlas"]
    model = atlas.model("qwen-coder")
    assert (model.upstream_name, model.parallel, model.ctx) == ("Qwen3-Coder", 2, 65536)
    assert atlas.url == "https://10.0.0.6:8443"  # the trailing slash is dropped


def test_secrets_stay_out_of_reprs():
    c = config(
        server={"admin_token": "s3cret-admin", "db": "postgresql://u:s3cret-db@db/crossbar"},
        routes={"convo": {"hosts": ["titan"], "keys": ["s3cret-client"]}},
    )
    hosts = {**HOSTS, "titan": {**HOSTS["titan"], "api_key": "s3cret-host"}}
    c2 = parse_config({"hosts": hosts})
    text = repr(c) + repr(c2)
    assert "s3cret" not in text
    assert "postgresql://u:***@db/crossbar" in text


def test_a_hosts_key_may_come_from_the_environment_variable_api_key_env_names():
    hosts = {**HOSTS, "titan": {**HOSTS["titan"], "api_key_env": "TITAN_KEY"}}
    c = parse_config({"hosts": hosts}, environ={"TITAN_KEY": "s3cret-host"})
    titan = c.hosts["titan"]
    assert (titan.api_key, titan.api_key_env) == ("s3cret-host", "TITAN_KEY")
    assert "s3cret" not in repr(c)
    assert c.hosts["atlas"].api_key_env == ""


@pytest.mark.parametrize(
    ("host", "environ", "message"),
    [
        ({"api_key_env": "TITAN_KEY"}, {}, "the environment variable TITAN_KEY is not set"),
        ({"api_key_env": "TITAN_KEY"}, {"TITAN_KEY": ""}, "TITAN_KEY is not set"),
        ({"api_key_env": "titan-key"}, {}, '"titan-key" is not an environment variable name'),
        ({"api_key_env": "K", "api_key": "x"}, {"K": "y"}, "set api_key or api_key_env, not both"),
    ],
)
def test_an_api_key_env_that_gives_no_key_is_an_error_under_its_path(host, environ, message):
    hosts = {**HOSTS, "titan": {**HOSTS["titan"], **host}}
    with pytest.raises(ConfigError) as info:
        parse_config({"hosts": hosts}, environ=environ)
    (error,) = info.value.errors
    assert error.startswith("hosts.titan.api_key_env: ") and message in error


def test_route_defaults_are_conversation_affinity_and_queueing():
    route = config(routes={"convo": {"hosts": ["titan", "atlas"]}}).route("convo")
    assert route.hosts == ("titan", "atlas")
    assert (route.affinity, route.per_route(), route.queues()) == ("conversation", False, True)
    assert (route.default_model, route.peers, route.keys, route.template) == ("", (), (), None)


def test_affinity_route_and_queue_false_are_reported_by_per_route_and_queues():
    route = config(routes={"ide": {"hosts": ["titan"], "affinity": "route", "queue": False}}).route(
        "ide"
    )
    assert route.per_route() is True
    assert route.queues() is False


def test_a_template_serves_every_name_its_glob_matches_and_only_those():
    c = config(templates={"projects": {"match": "proj-*", "hosts": ["atlas"], "queue": False}})
    route = c.route("proj-alpha")
    assert (route.name, route.hosts, route.template, route.queues()) == (
        "proj-alpha",
        ("atlas",),
        "projects",
        False,
    )
    assert c.route("project") is None
    assert c.route("other") is None


def test_a_template_route_is_made_once_per_config_and_remembered_within_a_bound(monkeypatch):
    import crossbar.config.values

    templates = {"projects": {"match": "proj-*", "hosts": ["atlas"]}}
    c = config(templates=templates)
    assert c.route("proj-alpha") is c.route("proj-alpha")  # made once, asked many times
    assert config(templates=templates).route("proj-alpha") is not c.route("proj-alpha")
    monkeypatch.setattr(crossbar.config.values, "_RESOLVED_MAX", 2)
    names = [f"proj-{i}" for i in range(5)]
    for name in names:
        assert c.route(name).name == name  # still served past the bound, made each time
    assert c.route("proj-4") is not c.route("proj-4")
    assert len(c._resolved) == 2


def test_the_first_template_in_file_order_wins():
    c = config(
        templates={
            "specific": {"match": "proj-a*", "hosts": ["titan"]},
            "general": {"match": "proj-*", "hosts": ["atlas"]},
        }
    )
    assert c.route("proj-alpha").template == "specific"
    assert c.route("proj-beta").template == "general"


def test_a_concrete_route_wins_over_a_matching_template():
    c = config(
        routes={"proj-alpha": {"hosts": ["titan"]}},
        templates={"projects": {"match": "proj-*", "hosts": ["atlas"]}},
    )
    assert c.route("proj-alpha").hosts == ("titan",)
    assert c.route("proj-alpha").template is None
    assert c.route("proj-beta").hosts == ("atlas",)


def test_a_template_never_serves_a_name_that_is_not_a_route_name():
    c = config(templates={"all": {"match": "*", "hosts": ["atlas"]}})
    assert c.route("UPPER") is None
    assert c.route("x" * 65) is None
    assert c.route("a/b") is None
    assert c.route("ok-name.1_2") is not None


def test_models_of_a_route_and_hosts_for_a_model_keep_preference_order():
    c = config(routes={"convo": {"hosts": ["atlas", "titan"]}})
    route = c.route("convo")
    assert c.models_of(route) == ["qwen-coder"]
    assert c.hosts_for(route, "qwen-coder") == ["atlas", "titan"]
    assert c.hosts_for(route, "other") == []


def test_a_default_route_must_exist():
    assert errors_of({"hosts": HOSTS, "server": {"default_route": "nope"}}) == [
        'server.default_route: unknown route "nope"'
    ]
    c = config(
        server={"default_route": "proj-x"}, templates={"p": {"match": "proj-*", "hosts": ["titan"]}}
    )
    assert c.server.default_route == "proj-x"


# Each rule of validation, with its message. One test per rule keeps the message visible.
RULES = [
    (
        {"routes": {"convo": {"hosts": ["titan"], "affinity": "sticky"}}},
        'routes.convo.affinity: must be "conversation" or "route"',
    ),
    ({"routes": {"convo": {"hosts": ["tytan"]}}}, 'routes.convo.hosts: unknown host "tytan"'),
    (
        {"routes": {"convo": {"hosts": ["titan", "titan"]}}},
        "routes.convo.hosts: names a host twice",
    ),
    (
        {"routes": {"convo": {}}},
        "routes.convo.hosts: missing (the candidate hosts, in preference order)",
    ),
    ({"routes": {"convo": {"hosts": []}}}, "routes.convo.hosts: must name at least one host"),
    (
        {"routes": {"convo": {"hosts": "titan"}}},
        "routes.convo.hosts: must be an array of strings, not a string",
    ),
    (
        {"routes": {"Convo": {"hosts": ["titan"]}}},
        'routes.Convo: bad route name "Convo" (use [a-z0-9][a-z0-9._-]{0,63})',
    ),
    (
        {"routes": {"convo": {"hosts": ["titan"], "queue": "yes"}}},
        'routes.convo.queue: must be true or false, not "yes"',
    ),
    (
        {"routes": {"convo": {"hosts": ["titan"], "peers": ["ghost"]}}},
        'routes.convo.peers: unknown route "ghost"',
    ),
    (
        {"routes": {"convo": {"hosts": ["titan"], "default_model": "llama"}}},
        'routes.convo.default_model: "llama" is served by none of the route\'s hosts',
    ),
    (
        {"routes": {"convo": {"hosts": ["titan"], "keys": ["k", "k"]}}},
        "routes.convo.keys: lists a key twice",
    ),
    (
        {"routes": {"convo": {"hosts": ["titan"], "keys": [""]}}},
        'routes.convo.keys: must hold only non-empty strings, not ""',
    ),
    (
        {"routes": {"convo": {"hosts": ["titan"], "colour": "red"}}},
        "routes.convo.colour: unknown key",
    ),
    (
        {"templates": {"p": {"hosts": ["titan"]}}},
        'templates.p.match: missing (a shell-style glob such as "proj-*")',
    ),
    (
        {"templates": {"p": {"match": "p-*", "hosts": ["tytan"]}}},
        'templates.p.hosts: unknown host "tytan"',
    ),
    (
        {"templates": {"p": {"match": "p-*", "hosts": ["titan"], "affinity": "x"}}},
        'templates.p.affinity: must be "conversation" or "route"',
    ),
    (
        {"templates": {"p": {"match": "p-*", "hosts": ["titan"], "extra": 1}}},
        "templates.p.extra: unknown key",
    ),
    (
        {"server": {"lease_idle": "2 hours"}},
        'server.lease_idle: "2 hours" is not a duration (use e.g. "250ms", "90s", "30m", "2h", "7d")',
    ),
    (
        {"server": {"lease_idle": 7200}},
        'server.lease_idle: must be a duration string such as "90s", not an integer 7200',
    ),
    (
        {"server": {"health_timeout": "0s"}},
        'server.health_timeout: must be longer than zero, not "0s"',
    ),
    (
        {"server": {"max_body": "lots"}},
        'server.max_body: "lots" is not a size (use e.g. "512KiB", "64MiB", "1GiB")',
    ),
    ({"server": {"queue_max": -1}}, "server.queue_max: must be at least 0, not -1"),
    (
        {"server": {"upstream_max_connections": 0}},
        "server.upstream_max_connections: must be at least 1, not 0",
    ),
    (
        {"server": {"upstream_connect_queue_timeout": "0s"}},
        'server.upstream_connect_queue_timeout: must be longer than zero, not "0s"',
    ),
    ({"server": {"unhealthy_after": 0}}, "server.unhealthy_after: must be at least 1, not 0"),
    ({"server": {"healthy_after": "2"}}, "server.healthy_after: must be an integer, not a string"),
    ({"server": {"admin_token": 5}}, "server.admin_token: must be a string, not an integer"),
    ({"server": {"listen": "tcpp:8080"}}, "server.listen: not a Twisted endpoint string"),
    (
        {"server": {"db": ""}},
        'server.db: must name a SQLite file (or ":memory:") or a PostgreSQL URL',
    ),
    ({"server": {"port": 8080}}, "server.port: unknown key"),
    ({"server": "fast"}, "server: must be a table, not a string"),
    (
        {"hosts": {**HOSTS, "nova": {"url": "ftp://x", "models": ["m"]}}},
        'hosts.nova.url: not an http(s) URL: "ftp://x"',
    ),
    (
        {"hosts": {**HOSTS, "nova": {"url": "http://x:99999", "models": ["m"]}}},
        'hosts.nova.url: not an http(s) URL (bad port): "http://x:99999"',
    ),
    (
        {"hosts": {**HOSTS, "nova": {"models": ["m"]}}},
        "hosts.nova.url: missing (the base URL of the llama-server)",
    ),
    (
        {"hosts": {**HOSTS, "nova": {"url": "http://x"}}},
        'hosts.nova.models: missing (a list of model names, a table per model, or "discover")',
    ),
    (
        {"hosts": {**HOSTS, "nova": {"url": "http://x", "models": []}}},
        "hosts.nova.models: must name at least one model",
    ),
    (
        {"hosts": {**HOSTS, "nova": {"url": "http://x", "models": "m"}}},
        'hosts.nova.models: must be an array of names, a table per model, or "discover", not "m"',
    ),
    (
        {"hosts": {**HOSTS, "nova": {"url": "http://x", "models": ["m", 3]}}},
        "hosts.nova.models[1]: must be a model name, not 3",
    ),
    (
        {"hosts": {**HOSTS, "nova": {"url": "http://x", "models": ["m", "m"]}}},
        'hosts.nova.models: model "m" is listed twice',
    ),
    (
        {
            "hosts": {
                **HOSTS,
                "nova": {
                    "url": "http://x",
                    "models": {"a": {"upstream": "U"}, "b": {"upstream": "U"}},
                },
            }
        },
        'hosts.nova.models.b.upstream: upstream name "U" is already used by model "a"',
    ),
    (
        {
            "hosts": {
                **HOSTS,
                "nova": {"url": "http://x", "models": {"a": {"upstream": "b"}, "b": {}}},
            }
        },
        'hosts.nova.models.b: upstream name "b" is already used by model "a"',
    ),
    (
        {"hosts": {**HOSTS, "nova": {"url": "http://x", "models": {"a": {"slots": 2}}}}},
        "hosts.nova.models.a.slots: unknown key",
    ),
    (
        {"hosts": {**HOSTS, "nova": {"url": "http://x", "models": ["m"], "parallel": 0}}},
        "hosts.nova.parallel: must be at least 1, not 0",
    ),
    (
        {"hosts": {**HOSTS, "Nova": {"url": "http://x", "models": ["m"]}}},
        'hosts.Nova: bad host name "Nova" (use [a-z0-9][a-z0-9._-]{0,63})',
    ),
    ({"hosts": {}}, "hosts: no hosts configured (add a [hosts.<name>] table)"),
    ({"limits": {}}, "limits: unknown key"),
]


@pytest.mark.parametrize(("change", "message"), RULES, ids=[m.split(":")[0] for _, m in RULES])
def test_each_bad_value_is_reported_under_its_dotted_path(change, message):
    data = {"hosts": HOSTS, **change}
    found = errors_of(data)
    assert any(line.startswith(message) for line in found), found


def test_every_error_is_reported_at_once_not_just_the_first():
    found = errors_of(
        {
            "server": {"lease_idle": "forever", "colour": 1},
            "hosts": {**HOSTS, "nova": {"url": "gopher://x", "models": ["m"]}},
            "routes": {"convo": {"hosts": ["tytan"], "affinity": "x"}},
            "templates": {"p": {"hosts": ["titan"]}},
        }
    )
    assert [line.split(":")[0] for line in found] == [
        "server.lease_idle",
        "server.colour",
        "hosts.nova.url",
        "routes.convo.affinity",
        "templates.p.match",
        "routes.convo.hosts",
    ]
    assert str(ConfigError(found)).count("\n") == len(found) - 1


def test_peers_may_name_a_route_served_by_a_template():
    c = config(
        routes={"convo": {"hosts": ["titan"], "peers": ["proj-review"]}},
        templates={"p": {"match": "proj-*", "hosts": ["titan"]}},
    )
    assert c.route("convo").peers == ("proj-review",)


def test_usage_raw_retention_and_metrics_routes_are_read_and_checked():
    server = {"usage_raw_retention": "6h", "metrics_routes": ["team-7"]}
    config = parse_config({"hosts": HOSTS, "server": server})
    assert config.server.usage_raw_retention == 6 * 3600
    assert config.server.metrics_routes == ("team-7",)
    assert ServerConfig().usage_raw_retention == 48 * 3600 and ServerConfig().metrics_routes == ()
    found = errors_of(
        {"hosts": HOSTS, "server": {"usage_raw_retention": "soon", "metrics_routes": "team-7"}}
    )
    assert [e.split(":")[0] for e in found] == [
        "server.usage_raw_retention",
        "server.metrics_routes",
    ]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("http://10.0.0.5:8080", "http://10.0.0.5:8080"),
        ("http://localhost:8080", "http://127.0.0.1:8080"),
        ("http://[::1]:8080", "http://localhost:8080"),
        ("http://gpu:8080/", "http://GPU:8080"),
        ("http://gpu", "http://gpu:80"),
        ("https://gpu/llama/", "https://gpu:443/llama"),
    ],
)
def test_two_names_for_one_server_are_refused_with_the_dotted_path(first, second):
    hosts = {
        "titan": {"url": first, "models": ["m"]},
        "atlas": {"url": second, "models": ["m"]},
    }
    (error,) = errors_of({"hosts": hosts})
    assert error.startswith("hosts.atlas.url: ") and "the same server as hosts.titan" in error


def test_one_server_behind_two_paths_or_ports_is_two_hosts():
    hosts = {
        "a": {"url": "http://gpu:8080", "models": ["m"]},
        "b": {"url": "http://gpu:8081", "models": ["m"]},
        "c": {"url": "http://gpu:8080/other", "models": ["m"]},
        "d": {"url": "https://gpu:8080", "models": ["m"]},
    }
    assert set(parse_config({"hosts": hosts}).hosts) == {"a", "b", "c", "d"}


def test_output_limits_are_off_by_default_and_a_default_above_the_cap_is_refused():
    routes = {"convo": {"hosts": ["titan"]}}
    route = parse_config({"hosts": HOSTS, "routes": routes}).route("convo")
    assert (route.max_tokens_default, route.max_tokens_cap, route.limits_output) == (
        None,
        None,
        False,
    )
    routes = {"convo": {"hosts": ["titan"], "max_tokens_default": 4096, "max_tokens_cap": 1024}}
    assert errors_of({"hosts": HOSTS, "routes": routes}) == [
        "routes.convo.max_tokens_default: must be at most max_tokens_cap (1024), not 4096"
    ]
