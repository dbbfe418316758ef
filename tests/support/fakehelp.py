"""Helpers for the fake llama-server's own tests: a fresh client, guarded waits, SSE parsing."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.web.client import Agent, HTTPConnectionPool

from crossbar.testing.fakellama import FakeLlama


class Fakes:
    """`await fakes(**knobs)`: a fake llama-server on port 0 with `defaults` under `knobs`;
    `await fakes.stop()` stops every one started (a fixture's teardown)."""

    def __init__(self, **defaults: Any) -> None:
        self._defaults = defaults
        self.started: list[FakeLlama] = []

    async def __call__(self, **knobs: Any) -> FakeLlama:
        fake = FakeLlama(reactor, **{**self._defaults, **knobs})
        await fake.start()
        self.started.append(fake)
        return fake

    async def stop(self) -> None:
        for fake in self.started:
            await fake.stop()


def client() -> HTTPClient:
    """A client with no kept-alive connections, so every request is a fresh connection."""
    return HTTPClient(Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False)))


def wait(d: Deferred, seconds: float = 10) -> Deferred:
    """Guard an await that could hang."""
    return d.addTimeout(seconds, reactor)


async def until(predicate: Callable[[], bool], deadline: float = 10.0) -> None:
    """Wait for something the fake does on its own time, checking every 5 ms."""
    for _ in range(int(deadline / 0.005)):
        if predicate():
            return
        await deferLater(reactor, 0.005, lambda: None)
    raise AssertionError("condition never held")


async def post(fake: FakeLlama, path: str, body: Any) -> tuple[Any, Any]:
    """POST JSON; the response and its parsed JSON body (or text when it is not JSON)."""
    response = await wait(client().post(fake.url + path, json=body))
    text = (await wait(response.text())).strip()
    try:
        return response, json.loads(text)
    except ValueError:
        return response, text


async def get(fake: FakeLlama, path: str) -> tuple[Any, Any]:
    response = await wait(client().get(fake.url + path))
    text = await wait(response.text())
    try:
        return response, json.loads(text)
    except ValueError:
        return response, text


def events(text: str) -> list[Any]:
    """The `data:` payloads of an SSE body, JSON-decoded (`[DONE]` stays a string)."""
    out = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]
