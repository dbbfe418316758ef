"""Model aliases: a client's model name (Claude Code's, an app's hard-coded "gpt-4o") means a
model the route serves; the lease is the served model's; unknown names are an error or the
route's default, as the route says."""

import json

import pytest
import pytest_twisted

from crossbar.cli.main import main
from crossbar.config.route import Route
from crossbar.config.values import ConfigError, parse_config
from crossbar.proxy.routing import choose_model
from crossbar.wire.errors import ClientError
from tests.support.harness import MODEL, start_crossbar, start_fakes, wait

HOSTS = {
    "titan": {"url": "http://10.0.0.5:8080", "models": ["qwen-coder", "gemma"]},
    "atlas": {"url": "http://10.0.0.6:8080", "models": ["qwen-coder"]},
}
CLAUDE = "claude-sonnet-4-5-20250929"


def errors_of(routes=None, templates=None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config({"hosts": HOSTS, "routes": routes or {}, "templates": templates or {}})
    return info.value.errors


def test_aliases_keep_file_order_and_unknown_models_are_an_error_by_default():
    config = parse_config(
        {
            "hosts": HOSTS,
            "routes": {
                "convo": {
                    "hosts": ["titan"],
                    "aliases": {"claude-*": "qwen-coder", "gpt-4o": "gemma", "*": "gemma"},
                }
            },
            "templates": {
                "p": {"match": "p-*", "hosts": ["atlas"], "aliases": {"x": "qwen-coder"}}
            },
        }
    )
    convo = config.route("convo")
    assert convo.aliases == (("claude-*", "qwen-coder"), ("gpt-4o", "gemma"), ("*", "gemma"))
    assert convo.unknown_model == "error"
    assert config.route("p-1").aliases == (("x", "qwen-coder"),)


BAD = [
    (
        {"convo": {"hosts": ["atlas"], "aliases": {"claude-*": "gemma"}}},
        'routes.convo.aliases."claude-*": "gemma" is served by none of the route\'s hosts '
        "(they serve qwen-coder)",
    ),
    (
        {"convo": {"hosts": ["atlas"], "aliases": {"gpt-4o": 4}}},
        "routes.convo.aliases.gpt-4o: must be a non-empty string, not 4",
    ),
    (
        {"convo": {"hosts": ["atlas"], "aliases": ["gpt-4o"]}},
        "routes.convo.aliases: must be a table of strings, not an array",
    ),
    (
        {"convo": {"hosts": ["atlas"], "unknown_model": "maybe"}},
        'routes.convo.unknown_model: must be "error" (404 model_not_found) or "default" '
        '(serve default_model), not "maybe"',
    ),
    (
        {"convo": {"hosts": ["atlas"], "unknown_model": "default"}},
        'routes.convo.unknown_model: "default" needs the route\'s default_model '
        "(the model to serve instead)",
    ),
]


@pytest.mark.parametrize(("routes", "message"), BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_a_bad_alias_or_unknown_model_is_reported_under_its_dotted_path(routes, message):
    assert message in errors_of(routes)


def test_a_template_alias_to_no_served_model_is_reported_too():
    found = errors_of(templates={"p": {"match": "p-*", "hosts": ["atlas"], "aliases": {"a": "b"}}})
    assert found == [
        'templates.p.aliases.a: "b" is served by none of the route\'s hosts (they serve qwen-coder)'
    ]


SERVED = ["qwen-coder", "gemma"]


def route(**keys) -> Route:
    return Route(name="convo", hosts=("titan",), **keys)


def test_a_served_name_wins_over_any_alias_and_the_first_matching_alias_wins():
    r = route(aliases=(("*", "qwen-coder"), ("gem*", "gemma")))
    assert choose_model(r, SERVED, {"model": "gemma"}, "") == "gemma"
    assert choose_model(r, SERVED, {"model": "gemini-pro"}, "") == "qwen-coder"
    assert choose_model(r, SERVED, {}, "model=gpt-4o") == "qwen-coder"


def test_an_unknown_name_is_model_not_found_unless_the_route_serves_its_default():
    strict = route(aliases=(("claude-*", "gemma"),))
    with pytest.raises(ClientError) as info:
        choose_model(strict, SERVED, {"model": "gpt-4o"}, "")
    assert (info.value.status, info.value.code) == (404, "model_not_found")
    assert "use one of qwen-coder, gemma, or a name matching its aliases (claude-*)" in str(
        info.value
    )
    lenient = route(default_model="gemma", unknown_model="default")
    assert choose_model(lenient, SERVED, {"model": "gpt-4o"}, "") == "gemma"


def test_an_alias_to_a_model_no_host_serves_now_says_so():
    r = route(aliases=(("gpt-*", "llama"),))
    with pytest.raises(ClientError) as info:
        choose_model(r, SERVED, {"model": "gpt-4o"}, "")
    assert info.value.code == "model_not_found"
    assert "'gpt-4o' is an alias of model 'llama', which no host of route 'convo' serves" in (
        info.value.message
    )


ROUTES = {
    "convo": {
        "hosts": ["titan", "atlas"],
        "default_model": MODEL,
        "aliases": {"claude-*": MODEL, "gpt-4o": MODEL},
    },
    "lenient": {"hosts": ["titan"], "default_model": MODEL, "unknown_model": "default"},
}


@pytest_twisted.async_yield_fixture
async def crossbar():
    running = await start_crossbar(await start_fakes("titan", "atlas"), ROUTES)
    yield running
    await running.stop()


async def chat(crossbar, route: str, model: str, text: str = "Refactor the parser."):
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    response = await wait(
        crossbar.client().post(
            crossbar.url(route, "/v1/chat/completions"), data=json.dumps(body).encode()
        )
    )
    return response, json.loads(await wait(response.content()))


@pytest_twisted.ensureDeferred
async def test_clients_naming_aliases_share_the_served_models_lease_and_host(crossbar):
    first, reply = await chat(crossbar, "convo", CLAUDE)
    second, _ = await chat(crossbar, "convo", "gpt-4o")
    third, _ = await chat(crossbar, "convo", MODEL)
    hosts = {r.headers.getRawHeaders("X-Crossbar-Host")[0] for r in (first, second, third)}
    assert [r.code for r in (first, second, third)] == [200, 200, 200] and len(hosts) == 1
    (lease,) = crossbar.parts.table.snapshot("convo")
    assert lease.key.model == MODEL
    # The host was asked for the served model, and the answer names what the host returned.
    fake = crossbar.fakes[hosts.pop()]
    assert [c.model for c in fake.counters.completions] == [MODEL, MODEL, MODEL]
    assert reply["model"] == MODEL


@pytest_twisted.ensureDeferred
async def test_an_unknown_model_is_404_or_the_default_as_the_route_says(crossbar):
    response, body = await chat(crossbar, "convo", "gpt-5")
    assert response.code == 404 and body["error"]["code"] == "model_not_found"
    response, body = await chat(crossbar, "lenient", "gpt-5")
    assert response.code == 200 and body["model"] == MODEL


@pytest_twisted.ensureDeferred
async def test_the_model_list_shows_served_models_and_aliases_marked_as_such(crossbar):
    response = await wait(crossbar.client().get(crossbar.url("convo", "/v1/models")))
    listed = json.loads(await wait(response.content()))["data"]
    assert [(m["id"], m["kind"], m.get("alias_of")) for m in listed] == [
        (MODEL, "model", None),
        ("claude-*", "alias", MODEL),
        ("gpt-4o", "alias", MODEL),
    ]


def test_check_shows_each_routes_aliases_and_refuses_one_to_no_served_model(tmp_path, capsys):
    good = tmp_path / "good.toml"
    good.write_text(
        '[hosts.titan]\nurl = "http://127.0.0.1:9001"\nmodels = ["qwen-coder"]\n'
        '[routes.convo]\nhosts = ["titan"]\ndefault_model = "qwen-coder"\n'
        'unknown_model = "default"\n'
        'aliases = {"claude-*" = "qwen-coder", "gpt-4o" = "qwen-coder"}\n'
    )
    assert main(["check", str(good)]) == 0
    out = capsys.readouterr().out
    assert "aliases claude-* -> qwen-coder, gpt-4o -> qwen-coder; unknown_model default" in out
    bad = tmp_path / "bad.toml"
    bad.write_text(good.read_text().replace('"gpt-4o" = "qwen-coder"', '"gpt-4o" = "qwen-codr"'))
    assert main(["check", str(bad)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        'routes.convo.aliases.gpt-4o: "qwen-codr" is served by none of the route\'s hosts '
        "(they serve qwen-coder)",
        f"{bad}: 1 error(s)",
    ]
