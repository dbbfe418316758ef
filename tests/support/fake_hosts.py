"""Test doubles for hosts: an HTTP GET answering on a fake clock, an in-memory draining store."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from twisted.internet.defer import Deferred, ensureDeferred, fail, succeed
from twisted.internet.task import Clock
from twisted.logger import Logger, formatEvent
from twisted.python.failure import Failure

from crossbar.app.service import probe_timer
from crossbar.config.values import Config, parse_config
from crossbar.hosts.registry import Hosts
from crossbar.hosts.schedule import ProbeSchedule

HANG = "hang"
TITAN, ATLAS = "http://titan:8080", "http://atlas:8080"


class FakeHTTP:
    """A `Getter`: answers by URL from `answers` (status and body, an exception, or HANG);
    `post` is a `Poster` (a router's load and unload) answering `{"success": true}` unless
    `answers` has the URL, and keeping what was posted in `posted`.

    `delay` makes answers arrive that many clock seconds later.
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.posted: list[tuple[str, Any]] = []
        self.answers: dict[str, Any] = {}
        self.delay = 0.0
        self.calls: list[tuple[str, dict[str, str]]] = []
        self.cancelled: list[str] = []

    def set(self, url: str, answer: Any) -> None:
        self.answers[url] = answer

    def health(self, base: str, status: int, body: bytes | str = b"") -> None:
        self.answers[base + "/health"] = (status, _bytes(body))

    def props(self, base: str, total_slots: int, n_ctx: int, query: str = "") -> None:
        body = {"total_slots": total_slots, "default_generation_settings": {"n_ctx": n_ctx}}
        self.answers[base + "/props" + query] = (200, json.dumps(body).encode())

    def urls(self) -> list[str]:
        return [url for url, _ in self.calls]

    def __call__(self, url: str, headers: Mapping[str, str]) -> Deferred[tuple[int, bytes]]:
        self.calls.append((url, dict(headers)))
        answer = self.answers.get(url, (404, b"not found"))
        if answer == HANG:
            return Deferred(lambda _: self.cancelled.append(url))
        if isinstance(answer, BaseException):
            return fail(answer) if not self.delay else self._later(fail, answer)
        return succeed(answer) if not self.delay else self._later(succeed, answer)

    def post(self, url: str, headers: Mapping[str, str], body: bytes) -> Deferred[Any]:
        self.posted.append((url, json.loads(body)))
        return succeed(self.answers.get(url, (200, b'{"success": true}')))

    def _later(self, make: Any, value: Any) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.clock.callLater(self.delay, lambda: make(value).chainDeferred(d))
        return d


class FakeStore:
    """The store's draining methods, in memory; `broken` makes writes fail."""

    def __init__(self) -> None:
        self.rows: set[str] = set()
        self.broken = False

    async def set_draining(self, name: str, draining: bool) -> None:
        if self.broken:
            raise OSError("disk full")
        if draining:
            self.rows.add(name)
        else:
            self.rows.discard(name)

    async def list_draining(self) -> set[str]:
        return set(self.rows)


class LogCapture:
    """A Logger whose events are kept; `texts` are the formatted messages."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.logger = Logger(observer=self.events.append)

    @property
    def texts(self) -> list[str]:
        return [formatEvent(e) for e in self.events]


def config(hosts: dict[str, Any] | None = None, **server: Any) -> Config:
    """A config with `titan` (discovered slots) and `atlas` (configured), or the given hosts."""
    if hosts is None:
        hosts = {
            "titan": {"url": TITAN, "models": ["qwen"], "api_key": "sekrit-key"},
            "atlas": {"url": ATLAS, "models": ["qwen"], "parallel": 4, "ctx": 8192},
        }
    defaults = {
        "health_interval": "5s",
        "health_timeout": "2s",
        "unhealthy_after": 3,
        "healthy_after": 2,
    }
    return parse_config({"server": {**defaults, **server}, "hosts": hosts})


def _bytes(body: bytes | str) -> bytes:
    return body.encode() if isinstance(body, str) else body


class World:
    """Hosts on a fake clock with fake HTTP (every /health answering 200), a log and a listener."""

    def __init__(
        self, store: FakeStore | None = None, hosts: dict[str, Any] | None = None, **server: Any
    ) -> None:
        self.clock = Clock()
        self.http = FakeHTTP(self.clock)
        self.log = LogCapture()
        self.store = store
        self.changes: list[tuple[str, str]] = []
        self.config = config(hosts, **server)
        self.hosts = self.make(self.config)
        self.http.health(TITAN, 200)
        self.http.health(ATLAS, 200)

    def make(self, cfg: Any) -> Hosts:
        hosts = Hosts(
            cfg, self.clock, store=self.store, log=self.log.logger, get=self.http,
            post=self.http.post,
        )  # fmt: skip
        hosts.add_listener(lambda h, m: self.changes.append((h, m)))
        return hosts

    def timer(self) -> ProbeSchedule:
        """The probe timer as the service runs it, on this world's clock (not started)."""
        return probe_timer(self.config, self.hosts, self.clock)

    def rounds(self, n: int) -> None:
        for _ in range(n):
            done = fired(self.hosts.probe_all())
            assert done, "a probe round with instant answers finishes at once"


def fired(d: Deferred[Any]) -> list[Any]:
    """A list that gets the Deferred's result (or Failure) when it fires."""
    results: list[Any] = []
    d.addBoth(results.append)
    return results


def run(coro: Any) -> Any:
    """Run a coroutine that completes at once (the fakes never wait); raise what it raised."""
    result = fired(ensureDeferred(coro))
    assert result, "the coroutine waited on something"
    if isinstance(result[0], Failure):
        result[0].raiseException()
    return result[0]
