"""What `crossbar init` writes, from what servers said (no sockets): the names it gives hosts
and routes, and TOML that crossbar takes, with the next commands in its comments."""

import tomllib

import pytest

from crossbar.cli.draft import (
    Model,
    Ports,
    Server,
    base_url,
    draft,
    host_names,
    route_names,
    same_server,
    toml_string,
)
from crossbar.config import parse_config


def server(url: str, *models: str, **kw) -> Server:
    return Server(url, tuple(Model(m, slots=2, ctx=4096) for m in models), **kw)


def read(text: str, environ=None):
    return parse_config(tomllib.loads(text), environ=environ)


def test_a_host_is_named_after_its_host_part():
    servers = [
        server("http://gpu1:8080", "m"),
        server("http://gpu2.lab.example:8080", "m"),
        server("http://10.0.0.7:8080", "m"),
        server("http://[fd00::7]:8080", "m"),
        server("http://localhost:9000", "m"),
    ]
    assert host_names(servers) == ["gpu1", "gpu2", "10-0-0-7", "fd00-7", "local"]


def test_hosts_that_would_share_a_name_get_their_port_then_their_whole_host_name():
    servers = [
        server("http://127.0.0.1:8081", "m"),
        server("http://127.0.0.1:8082", "m"),
        server("http://gpu1.lab:8080", "m"),
        server("http://gpu1.dc2:8080", "m"),
        server("http://gpu3:8080", "m"),
    ]
    assert host_names(servers) == [
        "local-8081",
        "local-8082",
        "gpu1-lab-8080",
        "gpu1-dc2-8080",
        "gpu3",
    ]


def test_a_given_name_is_kept_and_a_host_that_would_take_it_steps_aside():
    servers = [server("http://10.0.0.7:8080", "m", name="gpu1"), server("http://gpu1:8080", "m")]
    assert host_names(servers) == ["gpu1", "gpu1-8080"]


def test_one_host_and_one_path_apart_still_get_two_names():
    servers = [server("http://gpu:8080", "m"), server("http://gpu:8080/b", "m")]
    assert host_names(servers) == ["gpu-8080", "gpu-8080-2"]


def test_a_route_is_named_after_its_model_in_the_characters_a_route_name_may_hold():
    models = ["qwen-coder", "Qwen2.5-Coder-7B", "unsloth/Qwen3-8B-GGUF:Q4_K_M", "QWEN-coder", "-x"]
    assert route_names(models) == [
        "qwen-coder",
        "qwen2.5-coder-7b",
        "unsloth-qwen3-8b-gguf-q4_k_m",
        "qwen-coder-2",
        "x",
    ]


def test_a_model_served_by_every_host_is_one_route_listing_them_all():
    servers = [server("http://gpu1:8080", "qwen"), server("http://gpu2:8080", "qwen")]
    made = draft(servers, Ports(), "crossbar.toml")
    config = read(made.text)
    assert list(config.hosts) == ["gpu1", "gpu2"]
    assert config.hosts["gpu1"].url == "http://gpu1:8080"
    (route,) = config.routes.values()
    assert (route.name, route.hosts, route.default_model) == ("qwen", ("gpu1", "gpu2"), "qwen")
    assert route.unknown_model == "default"  # Claude Code names claude-* models
    s = config.server
    assert (s.listen, s.admin_listen, s.db, s.default_route) == (
        "tcp:8080",
        "tcp:8081:interface=127.0.0.1",
        "crossbar.db",
        "qwen",
    )


def test_hosts_whose_models_differ_get_a_route_per_model_listing_the_hosts_that_serve_it():
    servers = [
        server("http://gpu1:8080", "qwen", "gemma"),
        server("http://gpu2:8080", "gemma"),
        server("http://gpu3:8080", "llama"),
    ]
    made = draft(servers, Ports(), "crossbar.toml")
    config = read(made.text)
    assert {r.name: r.hosts for r in config.routes.values()} == {
        "qwen": ("gpu1",),
        "gemma": ("gpu1", "gpu2"),
        "llama": ("gpu3",),
    }
    assert config.server.default_route == "gemma"  # the model the most hosts serve
    assert config.hosts["gpu1"].model_names == ("qwen", "gemma")


def test_a_router_discovers_its_models_and_a_key_is_named_by_its_variable_never_given():
    servers = [
        Server(
            "http://gpu1:8080",
            (Model("qwen", "loaded", 4, 8192), Model("gemma", "unloaded")),
            router=True,
            key_env="LLAMA_KEY",
        )
    ]
    made = draft(servers, Ports(), "crossbar.toml")
    assert 'models = "discover"' in made.text
    assert "qwen (loaded, 4 slots of 8192 tokens), gemma (unloaded)" in " ".join(
        line.removeprefix("# ") for line in made.text.splitlines()
    )
    config = read(made.text, environ={"LLAMA_KEY": "sk-secret"})
    host = config.hosts["gpu1"]
    assert (host.discover, host.api_key, host.api_key_env) == (True, "sk-secret", "LLAMA_KEY")
    assert [r.default_model for r in config.routes.values()] == ["qwen", "gemma"]


def test_a_routers_places_and_the_keys_that_steer_its_loads_are_written_commented():
    router = Server("http://gpu1:8080", (Model("qwen", "unloaded"), Model("gemma", "loaded")),
                    router=True, places=2)  # fmt: skip
    made = draft([router], Ports(), "crossbar.toml")
    assert "# max_loaded = 2  # models it holds at once (its /props)" in made.text
    assert '# keep_loaded = ["gemma"]' in made.text  # the one it has loaded now
    assert all(len(line) <= 100 for line in made.text.splitlines())
    host = read(made.text.replace("# max_loaded", "max_loaded").replace("# keep_", "keep_")
                .replace("# swap_after", "swap_after")).hosts["gpu1"]  # fmt: skip
    assert (host.max_loaded, host.keep_loaded, host.swap_after) == (2, ("gemma",), 120.0)
    unlimited = draft([Server("http://gpu1:8080", (Model("qwen"),), router=True, places=0)],
                      Ports(), "c.toml")  # fmt: skip
    assert "it says it has no limit" in unlimited.text


def test_the_comments_name_the_next_three_commands_and_the_clients_base_urls():
    made = draft([server("http://gpu1:8080", "qwen")], Ports(9000, 9001), "/etc/crossbar.toml")
    comments = [line for line in made.text.splitlines() if line.startswith("#")]
    text = "\n".join(comments)
    assert "crossbar check /etc/crossbar.toml" in text
    assert "twistd -n crossbar -c /etc/crossbar.toml" in text
    assert "http://localhost:9000/r/qwen/v1" in text  # OpenAI
    assert "http://localhost:9000/r/qwen " in text  # Anthropic, Claude Code
    assert "http://127.0.0.1:9001/" in text  # the dashboard
    assert all(len(line) <= 100 for line in comments), [c for c in comments if len(c) > 100]
    assert read(made.text).server.listen == "tcp:9000"


def test_a_commented_template_serves_other_route_names_once_uncommented():
    made = draft([server("http://gpu1:8080", "qwen")], Ports(), "c.toml")
    assert read(made.text).templates == ()
    start = made.text.index("# [templates.")
    uncommented = made.text[:start] + made.text[start:].replace("# ", "")
    config = read(uncommented)
    route = config.route("team-a")
    assert (route.template, route.hosts, route.default_model) == ("teams", ("gpu1",), "qwen")


@pytest.mark.parametrize(
    "name", ['say "hi"', "back\\slash", "line\nbreak", "del\x7f", "\u00e9t\u00e9-\U0001f999"]
)
def test_any_model_name_is_written_as_toml_that_reads_back_the_same(name):
    assert tomllib.loads(f"x = {toml_string(name)}")["x"] == name
    made = draft([server("http://gpu1:8080", name)], Ports(), "c.toml")
    (route,) = read(made.text).routes.values()
    assert route.default_model == name


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("http://gpu1:8080/", "http://gpu1:8080"),
        ("gpu1:8080", "http://gpu1:8080"),
        ("127.0.0.1:8081", "http://127.0.0.1:8081"),
        ("https://gpu1/llama/", "https://gpu1/llama"),
    ],
)
def test_a_base_url_gets_http_when_it_has_no_scheme_and_loses_its_trailing_slash(given, url):
    assert base_url(given) == url


@pytest.mark.parametrize("given", ["ftp://gpu1", "http://", "gpu1:80x", "http://gpu1/?a=1"])
def test_what_is_not_a_base_url_is_refused_saying_so(given):
    with pytest.raises(ValueError, match=r"gpu1|URL"):
        base_url(given)


def test_one_server_under_two_spellings_is_the_same_server():
    assert same_server("http://GPU1:80", "http://gpu1")
    assert same_server("http://localhost:8080", "http://127.0.0.1:8080")
    assert not same_server("http://gpu1:8080", "http://gpu1:8081")
    assert not same_server("http://gpu1:8080", "https://gpu1:8080")


def test_a_given_name_is_never_changed_even_when_a_derived_one_would_come_to_it_first():
    servers = [
        server("http://gpu1:8080", "m"),
        server("http://gpu1:8081", "m"),
        server("http://10.0.0.7:8080", "m", name="gpu1-8080"),
    ]
    assert host_names(servers) == ["gpu1-8080-2", "gpu1-8081", "gpu1-8080"]
