"""crossbar in front of a real llama-server in router mode (`models = "discover"`): the model
the router lists is served before it is loaded, the router loads it on the first request, its
slots and context then come from `/props?model=`, and a conversation reads its cache."""

from __future__ import annotations

import json
import pathlib

import pytest
import pytest_twisted

from tests.real.llamas import GGUF, Fleet, Llama
from tests.support.harness import start_crossbar

NAME = "gemma-small"  # the router names a model after its file
CTX, PARALLEL = 2048, 2


@pytest.fixture
def models(tmp_path: pathlib.Path) -> pathlib.Path:
    """The router's models directory: the test model under NAME."""
    where = tmp_path / "models"
    where.mkdir()
    (where / f"{NAME}.gguf").symlink_to(pathlib.Path(GGUF).resolve())
    return where


@pytest_twisted.ensureDeferred
async def test_a_real_router_serves_a_discovered_model_loaded_on_its_first_request(
    tmp_path, models
):
    # Every child the router starts takes these: 2 slots of CTX tokens; --no-repack as always.
    args = ["-np", str(PARALLEL), "-c", str(CTX * PARALLEL), "-t", "1", "--no-repack"]
    fleet = Fleet({"router": Llama.start("router", tmp_path, [*args, "--models-max", "1"],
                                         models_dir=models)})  # fmt: skip
    crossbar = None
    try:
        await fleet.ready()
        router = fleet.llamas["router"]
        hosts = {"router": {"url": router.url, "models": "discover"}}
        routes = {"convo": {"hosts": ["router"], "aliases": {"claude-*": NAME}}}
        crossbar = await start_crossbar({}, routes, hosts=hosts)
        parts = crossbar.parts
        await fleet.within(parts.hosts.probe_all(), 30, "probing the router")
        (status,) = parts.hosts.status()
        assert status["healthy"] and [(m["name"], m["state"]) for m in status["models"]] == [
            (NAME, "unloaded")
        ]

        messages = [
            {"role": "system", "content": "You are a terse assistant. Answer in one sentence."},
            {"role": "user", "content": "Name a colour and say why people like it."},
        ]

        async def ask() -> tuple[object, dict]:
            body = {"model": "claude-sonnet-4-5", "messages": messages, "max_tokens": 8}
            response = await crossbar.client().post(
                crossbar.url("convo", "/v1/chat/completions"), data=json.dumps(body).encode()
            )
            return response, json.loads(await response.content())

        response, first = await fleet.within(ask(), 120, "the first turn, loading the model")
        assert response.code == 200, first
        assert first["model"] == NAME  # what llama-server answers, not the client's alias
        await fleet.within(parts.hosts.probe_all(), 30, "probing the router again")
        assert (parts.hosts.parallel("router", NAME), parts.hosts.ctx("router", NAME)) == (
            PARALLEL,
            CTX,
        )
        messages += [first["choices"][0]["message"], {"role": "user", "content": "And another?"}]
        response, second = await fleet.within(ask(), 60, "the second turn")
        assert response.code == 200, second
        assert response.headers.getRawHeaders("X-Crossbar-Lease") == ["reused"]
        assert second["timings"]["cache_n"] > first["usage"]["prompt_tokens"] // 2
    finally:
        try:
            if crossbar is not None:
                await fleet.within(crossbar.stop(), 30, "stopping crossbar")
        finally:
            deaths = fleet.stop()
    assert not deaths, "\n".join(deaths)
