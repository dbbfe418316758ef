"""crossbar in front of a router-mode llama-server (`models = "discover"`): the route serves
what the router lists, requests name their model upstream, an unloaded model loads on its first
request, and each model's slots come from its own /props."""

from __future__ import annotations

import json

import pytest_twisted
from twisted.internet import reactor

from crossbar.testing.fakellama import FakeConfig
from crossbar.testing.fakerouter import FakeRouter
from tests.support.admin_harness import write_config
from tests.support.harness import start_crossbar, start_fakes, wait

CHAT = "/v1/chat/completions"


async def fleet(routes: dict, static: bool = False):
    router = FakeRouter(
        reactor,
        {"qwen": FakeConfig(parallel=4, ctx=8192), "gemma": FakeConfig(parallel=1, ctx=2048)},
        loaded=("qwen",),
    )
    await router.start()
    fakes = {"router": router}
    hosts = {"router": {"url": router.url, "models": "discover"}}
    if static:
        fakes |= await start_fakes("plain")  # serves qwen-coder only
        hosts["plain"] = {"url": fakes["plain"].url, "models": ["qwen-coder"]}
    crossbar = await start_crossbar(fakes, routes, hosts=hosts)
    await wait(crossbar.parts.hosts.probe_all())  # as at start-up, before the port opens
    return crossbar, router


async def ask(crossbar, path: str, body: dict | None = None, route: str = "convo"):
    http = crossbar.client()
    if body is None:
        response = await wait(http.get(crossbar.url(route, path)))
    else:
        response = await wait(http.post(crossbar.url(route, path), data=json.dumps(body).encode()))
    return response, json.loads(await wait(response.content()))


def turn(model: str, *texts: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": t} for t in texts]}


@pytest_twisted.ensureDeferred
async def test_the_route_serves_the_routers_models_and_an_unloaded_one_loads_on_request():
    crossbar, router = await fleet({"convo": {"hosts": ["router"], "default_model": "qwen"}})
    try:
        _, listed = await ask(crossbar, "/v1/models")
        assert [m["id"] for m in listed["data"]] == ["qwen", "gemma"]
        assert crossbar.parts.hosts.healthy("router")
        response, answer = await ask(crossbar, CHAT, turn("gemma", "Hello gemma."))
        assert response.code == 200 and answer["model"] == "gemma"
        assert router.status["gemma"] == "loaded" and router.loads == 1
        hosts = crossbar.parts.hosts
        assert (hosts.parallel("router", "gemma"), hosts.ctx("router", "gemma")) == (1, None)
        await wait(hosts.probe_all())  # the next round reads gemma's /props, now it is loaded
        assert (hosts.parallel("router", "gemma"), hosts.ctx("router", "gemma")) == (1, 2048)
        assert (hosts.parallel("router", "qwen"), hosts.ctx("router", "qwen")) == (4, 8192)
        assert router.loads == 1  # discovery never loaded anything
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_conversation_keeps_its_lease_per_model_and_reads_the_routers_cache():
    routes = {"convo": {"hosts": ["router"], "aliases": {"claude-*": "qwen"}}}
    crossbar, router = await fleet(routes)
    try:
        first = turn("claude-sonnet-4-5", "Refactor the parser, please.")
        response, answer = await ask(crossbar, CHAT, first)
        reply = answer["choices"][0]["message"]
        second = {
            **first,
            "messages": [*first["messages"], reply, {"role": "user", "content": "Go on."}],
        }
        response, again = await ask(crossbar, CHAT, second)
        assert response.headers.getRawHeaders("X-Crossbar-Lease") == ["reused"]
        assert again["timings"]["cache_n"] >= answer["usage"]["prompt_tokens"]
        (lease,) = crossbar.parts.table.snapshot("convo")
        assert (lease.key.model, lease.host) == ("qwen", "router")
        # The router was asked for its own name of the model, never the alias.
        assert [c.model for c in router.children["qwen"].counters.completions] == ["qwen", "qwen"]
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_get_to_a_router_names_the_model_so_the_router_knows_where_it_goes():
    crossbar, router = await fleet({"convo": {"hosts": ["router"], "default_model": "qwen"}})
    try:
        response, props = await ask(crossbar, "/props")
        assert response.code == 200 and props["total_slots"] == 4  # qwen's, not the router's
        response, slots = await ask(crossbar, "/slots?model=gemma")
        assert response.code == 200 and len(slots) == 1  # gemma's one slot
        assert router.status["gemma"] == "loaded"  # the router loaded it to answer
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_route_may_mix_a_router_and_a_plain_llama_server():
    routes = {"convo": {"hosts": ["router", "plain"], "aliases": {"gpt-*": "qwen-coder"}}}
    crossbar, _ = await fleet(routes, static=True)
    try:
        _, listed = await ask(crossbar, "/v1/models")
        assert [m["id"] for m in listed["data"]] == ["qwen", "gemma", "qwen-coder", "gpt-*"]
        response, _ = await ask(crossbar, CHAT, turn("gpt-4o", "Hello."))
        assert response.headers.getRawHeaders("X-Crossbar-Host") == ["plain"]
        response, _ = await ask(crossbar, CHAT, turn("gemma", "Hello."))
        assert response.headers.getRawHeaders("X-Crossbar-Host") == ["router"]
        response, error = await ask(crossbar, CHAT, turn("llama", "Hello."))
        assert response.code == 404 and error["error"]["code"] == "model_not_found"
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_the_service_opens_its_port_knowing_the_routers_models(tmp_path, serve):
    router = FakeRouter(reactor, {"qwen": FakeConfig(), "gemma": FakeConfig()})
    await router.start()
    hosts = {"router": {"url": router.url, "models": "discover"}}
    path = write_config(tmp_path / "c.toml", {}, {"convo": {"hosts": ["router"]}}, hosts=hosts)
    running = await serve(path, {"router": router})
    response = await wait(running.http().get(f"{running.proxy_url}/r/convo/v1/models"))
    listed = json.loads(await wait(response.content()))
    assert [m["id"] for m in listed["data"]] == ["qwen", "gemma"]
    states = (await running.get("/api/hosts"))["hosts"][0]["models"]
    assert [(m["name"], m["state"]) for m in states] == [
        ("qwen", "unloaded"),
        ("gemma", "unloaded"),
    ]
