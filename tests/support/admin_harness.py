"""A real CrossbarService (proxy and admin on port 0, config from a file) in front of fakes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attrs import define, field
from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.web.client import Agent, HTTPConnectionPool

from crossbar.app.service import CrossbarService
from crossbar.config.values import load_config
from crossbar.testing.fakellama import FakeLlama
from tests.support.harness import MODEL, host_table, wait

LOCAL = "tcp:0:interface=127.0.0.1"


def toml(data: dict[str, Any], prefix: str = "") -> str:
    """A TOML document for `data` (tables of strings, numbers, booleans and lists of them)."""
    scalars, tables = [], []
    for key, value in data.items():
        if isinstance(value, dict):
            tables.append(toml(value, f"{prefix}{key}."))
        else:
            scalars.append(f"{key} = {json.dumps(value)}")
    head = f"[{prefix[:-1]}]\n" if prefix and scalars else ""
    return head + "".join(line + "\n" for line in scalars) + "\n" + "".join(tables)


def write_config(
    path: Path,
    fakes: dict[str, FakeLlama],
    routes: dict[str, Any],
    server: dict[str, Any] | None = None,
    templates: dict[str, Any] | None = None,
    hosts: dict[str, Any] | None = None,
    keys: dict[str, Any] | None = None,
) -> Path:
    data: dict[str, Any] = {
        "server": {
            "listen": LOCAL,
            "admin_listen": LOCAL,
            "db": ":memory:",
            "shutdown_grace": "0s",
            **(server or {}),
        },
        "hosts": hosts or host_table(fakes, parallel=2),
        "routes": routes,
    }
    if templates:
        data["templates"] = templates
    if keys:
        data["keys"] = keys
    path.write_text(toml(data))
    return path


@define
class Running:
    """A started service; `admin(method, path)` calls the admin API, `chat` the proxy."""

    service: CrossbarService
    fakes: dict[str, FakeLlama]
    token: str = ""
    _pool: HTTPConnectionPool = field(factory=lambda: HTTPConnectionPool(reactor))

    @property
    def parts(self) -> Any:
        return self.service.parts

    @property
    def path(self) -> Path:
        """The config file the service reloads from."""
        return Path(self.service.config.path)

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.service.admin_port.getHost().port}"

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.service.proxy_port.getHost().port}"

    def http(self) -> HTTPClient:
        return HTTPClient(Agent(reactor, pool=self._pool))

    async def call(
        self, method: str, path: str, body: Any = None, token: str | None = None, **headers: str
    ) -> tuple[int, Any, Any]:
        """(status, parsed body or text, response) of one admin request."""
        token = self.token if token is None else token
        sent = {"Content-Type": "application/json", **headers}
        if token:
            sent["Authorization"] = f"Bearer {token}"
        data = (
            body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
        )
        response = await wait(
            self.http().request(method, self.admin_url + path, data=data, headers=sent)
        )
        text = (await wait(response.content())).decode()
        content_type = response.headers.getRawHeaders("Content-Type", [""])[0]
        parsed = json.loads(text) if content_type.startswith("application/json") else text
        return response.code, parsed, response

    async def get(self, path: str, **kw: Any) -> Any:
        """The JSON of a GET that must succeed."""
        code, body, _ = await self.call("GET", path, **kw)
        assert code == 200, body
        return body

    async def chat(
        self, route: str, messages: list[dict], **headers: str
    ) -> tuple[str, dict[str, Any]]:
        """(the host that answered, the reply) of one chat completion through the proxy."""
        response = await wait(
            self.http().post(
                f"{self.proxy_url}/r/{route}/v1/chat/completions",
                data=json.dumps({"model": MODEL, "messages": messages}).encode(),
                headers={"Content-Type": "application/json", **headers},
            )
        )
        reply = json.loads(await wait(response.content()))
        assert response.code == 200, reply
        return response.headers.getRawHeaders("X-Crossbar-Host")[0], reply

    async def stop(self) -> None:
        await self._pool.closeCachedConnections()
        if self.service.running:  # a test may have stopped it itself
            await wait(self.service.stopService())
        for fake in self.fakes.values():
            await fake.stop()


async def start_service(path: Path, fakes: dict[str, FakeLlama], token: str = "") -> Running:
    """Start crossbar from the config file at `path`, as twistd would (admin API included)."""
    service = CrossbarService(load_config(path), reactor)
    service.startService()
    try:
        await wait(service.ready)
    except Exception:
        await service.stopService()
        raise
    return Running(service, fakes, token)


def conversation(name: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Conversation {name}: refactor the parser."}]
