"""The prober over real sockets: a tiny llama-server stand-in on port 0, real treq, real reactor."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest_twisted
from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IListeningPort
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from crossbar.hosts.registry import Hosts
from tests.support.fake_hosts import LogCapture, config

LOADING = b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'
PROPS = {"total_slots": 3, "default_generation_settings": {"n_ctx": 4096}}


class Llama(Resource):
    """/health and /props with answers a test can switch; `hang` leaves requests unanswered."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.health: tuple[int, bytes] = (200, b'{"status":"ok"}')
        self.props: tuple[int, bytes] = (200, json.dumps(PROPS).encode())
        self.hang = False
        self.auth: list[str | None] = []
        self.hung: list[Deferred[None]] = []

    def render_GET(self, request: Request) -> bytes | int:
        self.auth.append(request.getHeader("authorization"))
        if self.hang:
            self.hung.append(request.notifyFinish())
            return NOT_DONE_YET
        answers = {b"/health": self.health, b"/props": self.props}
        status, body = answers.get(request.path, (404, b"not found"))
        request.setResponseCode(status)
        request.setHeader("content-type", "application/json")
        return body


class Server:
    def __init__(self, resource: Llama, port: IListeningPort) -> None:
        self.llama = resource
        self.port = port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port.getHost().port}"


@pytest_twisted.async_yield_fixture
async def server() -> AsyncIterator[Server]:
    llama = Llama()
    port = reactor.listenTCP(0, Site(llama), interface="127.0.0.1")  # type: ignore[attr-defined]
    yield Server(llama, port)
    await port.stopListening()


@pytest_twisted.async_yield_fixture
async def pool() -> AsyncIterator[HTTPConnectionPool]:
    p = HTTPConnectionPool(reactor)
    yield p
    await p.closeCachedConnections()


def closed_port() -> int:
    """A port nobody listens on: bind to get a free one, then close it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_hosts(url: str, log: LogCapture, **server: Any) -> Hosts:
    hosts = {"titan": {"url": url, "models": ["qwen"], "api_key": "k3y"}}
    cfg = config(hosts, unhealthy_after=1, healthy_after=1, **server)
    return Hosts(cfg, reactor, log=log.logger)  # type: ignore[arg-type]


async def probe(hosts: Hosts) -> None:
    await hosts.probe_all().addTimeout(10, reactor)  # type: ignore[arg-type]


@pytest_twisted.ensureDeferred
async def test_a_real_server_is_probed_discovered_and_flipped(server: Server) -> None:
    log = LogCapture()
    hosts = make_hosts(server.url, log)
    try:
        await probe(hosts)
        assert hosts.healthy("titan")
        assert hosts.parallel("titan", "qwen") == 3 and hosts.ctx("titan", "qwen") == 4096
        assert server.llama.auth == ["Bearer k3y", "Bearer k3y"]
        server.llama.health = (503, LOADING)
        await probe(hosts)
        assert not hosts.healthy("titan")
        assert hosts.status()[0]["last_probe"]["reason"] == "status 503: Loading model"
        server.llama.health = (200, b"{}")
        await probe(hosts)
        assert hosts.healthy("titan")
        assert not any("k3y" in t for t in log.texts)
    finally:
        await hosts.stop()


@pytest_twisted.ensureDeferred
async def test_a_closed_port_is_a_failed_probe_reason_refused() -> None:
    hosts = make_hosts(f"http://127.0.0.1:{closed_port()}", LogCapture())
    try:
        await probe(hosts)
        assert not hosts.healthy("titan")
        assert hosts.status()[0]["last_probe"]["reason"] == "refused"
    finally:
        await hosts.stop()


@pytest_twisted.ensureDeferred
async def test_a_hung_server_fails_at_health_timeout_and_the_request_is_aborted(
    server: Server,
) -> None:
    server.llama.hang = True
    hosts = make_hosts(server.url, LogCapture(), health_timeout="300ms")
    try:
        started = reactor.seconds()  # type: ignore[attr-defined]
        await probe(hosts)
        assert reactor.seconds() - started >= 0.3  # type: ignore[attr-defined]
        assert not hosts.healthy("titan")
        assert hosts.status()[0]["last_probe"]["reason"].startswith("timeout")
        (finished,) = server.llama.hung
        lost: list[Any] = []
        finished.addErrback(lost.append)
        await finished.addTimeout(5, reactor)  # type: ignore[arg-type]
        assert lost, "the server saw the probe's connection go away"
    finally:
        await hosts.stop()


@pytest_twisted.ensureDeferred
async def test_a_given_treq_client_is_used_and_left_open(
    server: Server, pool: HTTPConnectionPool
) -> None:
    client = HTTPClient(Agent(reactor, pool=pool))  # type: ignore[arg-type]
    cfg = config({"titan": {"url": server.url, "models": ["qwen"]}})
    hosts = Hosts(cfg, reactor, http=client, log=LogCapture().logger)  # type: ignore[arg-type]
    await probe(hosts)
    assert server.llama.auth == [None, None]  # no api key: no Authorization header
    await hosts.stop()
    assert pool._connections, "the caller's pool keeps its connections until the caller closes it"
