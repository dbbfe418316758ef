"""A stop waits only for requests still running: answered ones are not waited for."""

import pytest_twisted

from tests.support.harness import MODEL, start_crossbar, start_fakes, wait

ROUTES = {"convo": {"hosts": ["titan"], "default_model": MODEL}}


@pytest_twisted.async_yield_fixture
async def crossbar():
    running = await start_crossbar(await start_fakes("titan"), ROUTES)
    yield running
    await running.stop()


@pytest_twisted.ensureDeferred
async def test_requests_crossbar_answers_itself_are_not_left_running(crossbar):
    # /health, /v1/models and a 404 are answered before the first await: the proxy must still
    # see them finish, or a stop waits shutdown_grace for them (and they pile up meanwhile).
    client = crossbar.client()
    for path in ("/r/convo/health", "/r/convo/v1/models", "/r/nope/v1/models"):
        response = await wait(client.get(crossbar.base + path))
        await wait(response.content())
    response, _ = await crossbar.chat("convo", [{"role": "user", "content": "hi"}])
    assert response.code == 200
    proxy = crossbar.sites.resource
    assert proxy.running == 0
    assert await wait(proxy.drain(30), 2) == 0
