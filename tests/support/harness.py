"""Real crossbar sites and fake llama-servers on port 0, for the integration stories."""

from __future__ import annotations

import json
from typing import Any

from attrs import define, field
from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.web.client import Agent, HTTPConnectionPool

from crossbar.app.wiring import Parts, Sites, build_parts, make_sites
from crossbar.config.values import Config, parse_config
from crossbar.testing.fakellama import FakeLlama

MODEL = "qwen-coder"


async def start_fakes(*names: str, **knobs: Any) -> dict[str, FakeLlama]:
    fakes = {}
    for name in names:
        fake = FakeLlama(reactor, models=[MODEL], **knobs)
        await fake.start()
        fakes[name] = fake
    return fakes


@define
class Crossbar:
    """A crossbar site on a real port in front of fakes; `url(route, path)` builds client URLs."""

    config: Config
    parts: Parts
    sites: Sites
    port: Any
    fakes: dict[str, FakeLlama]
    http: Any = None
    _pools: list[HTTPConnectionPool] = field(factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port.getHost().port}"

    def url(self, route: str, path: str) -> str:
        return f"{self.base}/r/{route}{path}"

    def client(self) -> HTTPClient:
        pool = HTTPConnectionPool(reactor, persistent=True)
        self._pools.append(pool)
        return HTTPClient(Agent(reactor, pool=pool))

    async def chat(self, route: str, messages: list[dict], **extra: Any) -> tuple[Any, dict]:
        body = {"model": MODEL, "messages": messages, **extra}
        response = await self.client().post(
            self.url(route, "/v1/chat/completions"),
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        return response, json.loads(await response.content())

    async def pin(self, route: str, host: str) -> None:
        """Pin `route` to `host` as the admin API does."""
        table = self.parts.table
        table.note_candidates(route, self.config.route(route).hosts)
        await table.pin(route, host, reactor.seconds())

    async def stop(self) -> None:
        for pool in self._pools:
            await pool.closeCachedConnections()
        await self.port.stopListening()
        await self.parts.upstream.close()
        if self.parts.tracing is not None:
            await self.parts.tracing.close()
        self.parts.handoff.close()
        await self.parts.hosts.stop()
        await self.parts.store.close()
        for fake in self.fakes.values():
            await fake.stop()


def host_table(fakes: dict[str, FakeLlama], **extra: Any) -> dict[str, Any]:
    return {name: {"url": f.url, "models": [MODEL], **extra} for name, f in fakes.items()}


async def start_crossbar(
    fakes: dict[str, FakeLlama],
    routes: dict[str, Any],
    server: dict[str, Any] | None = None,
    hosts: dict[str, Any] | None = None,
    keys: dict[str, Any] | None = None,
    tracing: dict[str, Any] | None = None,
    **host_extra: Any,
) -> Crossbar:
    data = {
        "server": {"db": ":memory:", **(server or {})},
        "hosts": hosts or host_table(fakes, **host_extra),
        "routes": routes,
        "keys": keys or {},
    }
    if tracing is not None:
        data["tracing"] = tracing
    config = parse_config(data)
    parts = await build_parts(config, reactor)
    sites = make_sites(config, parts, reload=_no_reload)
    port = reactor.listenTCP(0, sites.proxy, interface="127.0.0.1")
    return Crossbar(config, parts, sites, port, fakes)


async def _no_reload() -> list[str]:
    raise NotImplementedError("this harness has no config file to reload")


def wait(d: Any, seconds: float = 10) -> Deferred:
    """Guard an await that could hang: fail after `seconds` instead of blocking the suite."""
    return ensureDeferred(d).addTimeout(seconds, reactor)


def turn(history: list[dict], reply: dict, text: str) -> list[dict]:
    """The next turn's messages: history, the assistant's reply, a new user message."""
    answer = reply["choices"][0]["message"]["content"]
    return [*history, {"role": "assistant", "content": answer}, {"role": "user", "content": text}]


async def until(predicate, deadline: float = 10.0) -> None:
    """Wait for a condition another party brings about, checking every 10 ms, with a deadline."""
    from twisted.internet.task import deferLater

    for _ in range(int(deadline / 0.01)):
        if predicate():
            return
        await deferLater(reactor, 0.01, lambda: None)
    raise AssertionError("condition never held")
