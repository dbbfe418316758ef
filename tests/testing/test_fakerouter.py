"""The fake's router mode behaves as llama-server's router: models listed with a status, loaded
on demand by the requests that name them, each with its own slots and context."""

import pytest_twisted
from twisted.internet import reactor

from crossbar.testing.fakellama import FakeConfig
from crossbar.testing.fakerouter import FakeRouter
from tests.support.fakehelp import client, get, post, user


@pytest_twisted.async_yield_fixture
async def router():
    models = {"qwen": FakeConfig(parallel=4, ctx=8192), "gemma": FakeConfig(parallel=1, ctx=2048)}
    router = FakeRouter(reactor, models, loaded=("qwen",))
    await router.start()
    yield router
    await router.stop()


@pytest_twisted.ensureDeferred
async def test_models_are_listed_with_their_status_and_health_is_the_routers_own(router):
    response, listing = await get(router, "/models")
    assert [(m["id"], m["status"]["value"]) for m in listing["data"]] == [
        ("qwen", "loaded"),
        ("gemma", "unloaded"),
    ]
    response, health = await get(router, "/health")
    assert response.code == 200 and health == {"status": "ok"}
    _, props = await get(router, "/props")
    assert props["role"] == "router" and props["default_generation_settings"]["n_ctx"] == 0


@pytest_twisted.ensureDeferred
async def test_each_model_has_its_own_props_and_an_unloaded_one_is_not_loaded_by_asking(router):
    _, qwen = await get(router, "/props?model=qwen")
    assert (qwen["total_slots"], qwen["default_generation_settings"]["n_ctx"]) == (4, 8192)
    response, refused = await get(router, "/props?model=gemma&autoload=false")
    assert response.code == 400 and refused["error"]["message"] == "model is not loaded"
    assert router.status["gemma"] == "unloaded" and router.loads == 0


@pytest_twisted.ensureDeferred
async def test_a_request_loads_its_model_and_is_answered_by_that_models_server(router):
    response, answer = await post(
        router, "/v1/chat/completions", {"model": "gemma", "messages": user("hi")}
    )
    assert response.code == 200 and answer["model"] == "gemma"
    assert router.status["gemma"] == "loaded" and router.loads == 1
    assert len(router.children["gemma"].counters.completions) == 1
    assert router.children["qwen"].counters.completions == []
    _, gemma = await get(router, "/props?model=gemma&autoload=false")
    assert gemma["total_slots"] == 1


@pytest_twisted.ensureDeferred
async def test_a_request_without_a_known_model_is_refused_as_the_router_does(router):
    response, error = await post(router, "/v1/chat/completions", {"messages": user("hi")})
    assert response.code == 400
    assert error["error"]["message"] == "model name is missing from the request"
    response, error = await post(
        router, "/v1/chat/completions", {"model": "llama", "messages": user("hi")}
    )
    assert (response.code, error["error"]["message"]) == (400, "model 'llama' not found")
    response, error = await get(router, "/slots")
    assert response.code == 400


@pytest_twisted.ensureDeferred
async def test_unloading_a_model_forgets_its_prompt_cache(router):
    body = {"model": "qwen", "messages": user("A long question about parsers.")}
    await post(router, "/v1/chat/completions", body)
    response, _ = await post(router, "/models/unload", {"model": "qwen"})
    assert response.code == 200 and router.status["qwen"] == "unloaded"
    _, again = await post(router, "/v1/chat/completions", body)
    assert again["timings"]["cache_n"] == 0 and router.loads == 1


@pytest_twisted.ensureDeferred
async def test_a_router_with_an_api_key_wants_it_for_its_own_paths_and_its_models():
    router = FakeRouter(reactor, {"qwen": FakeConfig()}, loaded=("qwen",), api_key="sk-llama")
    await router.start()
    try:
        assert (await get(router, "/health"))[0].code == 200
        for path in ("/v1/models", "/props", "/props?model=qwen"):
            response, body = await get(router, path)
            assert (response.code, body["error"]["type"]) == (401, "authentication_error"), path
        response = await client().get(
            router.url + "/props?model=qwen", headers={"Authorization": "Bearer sk-llama"}
        )
        assert response.code == 200 and (await response.json())["total_slots"] == 2
    finally:
        await router.stop()
