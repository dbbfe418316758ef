"""crossbar on an in-memory network: clients and hosts are protocols joined by
`twisted.test.iosim` transports, time is a Clock, nothing touches a socket or a thread.

The proxy rules that hang on timing (a cancel while the host thinks, a keep-alive race on a
pooled connection, a stop's grace period) are told here step by step: each `flush` moves every
byte that can move, and nothing else happens until the test says so.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Callable
from typing import Any

from attrs import define, field
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.error import ConnectError, ConnectionRefusedError, TimeoutError
from twisted.internet.interfaces import (
    IHostnameResolver,
    IReactorPluggableNameResolver,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.test.iosim import FakeTransport, IOPump, connect
from twisted.web.iweb import IAgentEndpointFactory
from zope.interface import directlyProvides, implementer

from crossbar.app.wiring import Parts, Sites, build_parts, make_sites
from crossbar.config.values import parse_config
from crossbar.testing.fakellama import FakeLlama
from crossbar.testing.fakerouter import FakeRouter
from crossbar.testing.fakestate import FakeConfig
from tests.support.lease_fakes import MemoryStore, run_now

MODEL = "qwen-coder"
CHAT_PATH = "/r/convo/v1/chat/completions"


class Host(Protocol):
    """One connection a fake host accepted: it keeps what arrived and answers when told."""

    def __init__(self, net: Net, name: str) -> None:
        self.net, self.name = net, name
        self.received = b""
        self.handled = 0  # of `received`: what on_request was called for
        self.lost = False

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        self.net.host_heard(self)

    def requests(self) -> int:
        """Complete request heads seen on this connection."""
        return self.received.count(b"\r\n\r\n")

    def answer(self, body: bytes = b'{"id": "x"}', status: bytes = b"200 OK") -> None:
        self.transport.write(
            b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )

    def connectionLost(self, reason: Any = None) -> None:
        self.lost = True


class Client(Protocol):
    """A client connection to the proxy: what it sent, and what came back."""

    def __init__(self) -> None:
        self.received = b""
        self.lost = False
        self.channel: Any = None  # the proxy's end of the connection

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Any = None) -> None:
        self.lost = True

    def stop_reading(self) -> None:
        """Stop taking bytes: the proxy's connection is paused, as a TCP transport whose send
        buffer is full pauses it (in-memory transports never do by themselves)."""
        self.channel.pauseProducing()

    def read_again(self) -> None:
        self.channel.resumeProducing()

    @property
    def status(self) -> int | None:
        line = self.received.split(b"\r\n", 1)[0]
        return int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else None

    def header(self, name: bytes) -> bytes | None:
        head = self.received.split(b"\r\n\r\n", 1)[0]
        for line in head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name.lower():
                return value.strip()
        return None


@implementer(IStreamClientEndpoint)
@define
class _Endpoint:
    net: Net
    name: str

    def connect(self, factory: Any) -> Deferred:
        return self.net.connect_host(self.name, factory)


class OwnFault(ConnectError):
    """What a connect raises when this process is out of file descriptors."""

    def __init__(self) -> None:
        super().__init__(errno.EMFILE, "Too many open files")


@implementer(IHostnameResolver)
@define
class StalledNames:
    """A name resolver that starts every lookup and finishes none."""

    asked: list[str] = field(factory=list)

    def resolveHostName(self, receiver: Any, hostName: str, *args: Any, **kw: Any) -> Any:
        self.asked.append(hostName)
        receiver.resolutionBegan(None)
        return None


@implementer(IAgentEndpointFactory)
@define
class _Endpoints:
    net: Net

    def endpointForURI(self, uri: Any) -> IStreamClientEndpoint:
        name = uri.host.decode()
        if name in self.net.stall:
            # Twisted's own endpoint, looking the name up: what a cancel then raises is
            # Twisted's choice (DNSLookupError), not the test's.
            reactor = MemoryReactorClock()
            reactor.nameResolver = self.net.names
            directlyProvides(reactor, IReactorPluggableNameResolver)
            return HostnameEndpoint(reactor, name, uri.port)
        return _Endpoint(self.net, name)


@define
class Net:
    """The in-memory network: hosts by name (their URL's host part), every connection's pump,
    and what hosts do when a request arrives (`on_request`, per host name)."""

    clock: Clock = field(factory=Clock)
    pumps: list[IOPump] = field(factory=list)
    connections: dict[str, list[Host]] = field(factory=dict)
    refusing: set[str] = field(factory=set)
    hanging: set[str] = field(factory=set)  # connects that neither succeed nor fail by themselves
    out_of_fds: set[str] = field(factory=set)  # connects that fail here: no descriptor left
    connect_timeout: float = 5.0
    stall: set[str] = field(factory=set)  # hosts whose name lookups never finish
    names: StalledNames = field(factory=StalledNames)
    on_request: dict[str, Callable[[Host], None]] = field(factory=dict)
    # Hosts served by a fake llama-server (or a fake router) on the net's clock, by name.
    fakes: dict[str, FakeLlama | FakeRouter] = field(factory=dict)

    def serve(self, name: str, **config: Any) -> FakeLlama:
        """Serve host `name` with a fake llama-server whose time is the net's clock: its
        prefill and decode take clock time, so a story moves them by advancing it."""
        fake = self.fakes[name] = FakeLlama(self.clock, models=[MODEL], **config)
        return fake

    def serve_router(self, name: str, models: dict[str, FakeConfig], **knobs: Any) -> FakeRouter:
        """Serve host `name` with a fake router-mode llama-server of `models` on the net's
        clock (`knobs`: FakeRouter's, such as models_max and load_delay)."""
        router = FakeRouter(self.clock, models, **knobs)
        self.fakes[name] = router
        return router

    def run(self, seconds: float) -> None:
        """Let `seconds` of clock time pass, stopping at each timer due on the way (exactly
        when it is due) and moving every byte after each."""
        clock = self.clock
        end = clock.seconds() + seconds
        self.flush()
        while True:
            due = min((c.getTime() for c in clock.getDelayedCalls()), default=end)
            step = min(due, end) - clock.seconds()
            if step > 0:
                clock.advance(step)
            self.flush()
            if clock.seconds() >= end:
                return

    def endpoints(self) -> IAgentEndpointFactory:
        return _Endpoints(self)

    def connect_host(self, name: str, factory: Any) -> Deferred:
        if name in self.refusing:
            return fail(ConnectionRefusedError())
        if name in self.out_of_fds:
            return fail(OwnFault())
        if name in self.hanging:
            # A host that takes no connection: the connect times out, as a TCP endpoint's
            # does, `connect_timeout` seconds later on the net's clock (later if the clock
            # jumps past it: a frozen process).
            pending: Deferred = Deferred()
            timer = self.clock.callLater(self.connect_timeout, pending.errback, TimeoutError())
            pending.addBoth(lambda result: (timer.active() and timer.cancel(), result)[1])
            return pending
        client = factory.buildProtocol(None)
        fake = self.fakes.get(name)
        if fake is not None:
            self._join(fake.factory.buildProtocol(None), client)
            return succeed(client)
        host = Host(self, name)
        self.connections.setdefault(name, []).append(host)
        self._join(host, client)
        return succeed(client)

    def host_heard(self, host: Host) -> None:
        handler = self.on_request.get(host.name)
        newest = host.received[host.handled :]
        head, found, body = newest.partition(b"\r\n\r\n")
        if handler is None or not found:
            return
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(body) >= length:  # the newest request is all in
            host.handled = len(host.received)
            handler(host)

    def client(self, site: Any, peer: str = "10.0.0.9") -> Client:
        """A new client connection to `site` from `peer`."""
        client = Client()
        server = site.buildProtocol(None)
        client.channel = server
        self._join(server, client, IPv4Address("TCP", peer, 40000))
        return client

    def _join(self, server: Any, client: Any, peer: Any = None) -> FakeTransport:
        server_io = FakeTransport(server, isServer=True, peerAddress=peer)
        client_io = FakeTransport(client, isServer=False)
        self.pumps.append(connect(server, server_io, client, client_io, greet=False))
        return server_io

    def flush(self) -> None:
        """Move every byte that can move (and run what is due now), until nothing moves."""
        for _ in range(100):
            moved = False
            for pump in list(self.pumps):
                moved |= pump.flush(advanceClock=False)
            self.clock.advance(0)
            if not moved:
                return
        raise AssertionError("the network never settled")


@define
class Crossbar:
    """The proxy site over the in-memory net."""

    net: Net
    parts: Parts
    sites: Sites
    store: MemoryStore

    def admin(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Call the admin API as a loopback client; (status, parsed JSON)."""
        client = self.net.client(self.sites.admin, peer="127.0.0.1")
        data = b"" if body is None else json.dumps(body).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(data)}\r\n"
        client.transport.write(head.encode() + b"\r\n" + data)
        self.net.flush()
        assert client.status is not None, client.received
        answer = client.received.split(b"\r\n\r\n", 1)[1]
        if client.header(b"transfer-encoding") == b"chunked":
            answer = _unchunk(answer)
        try:
            return client.status, json.loads(answer)
        except ValueError:
            return client.status, answer.decode()

    def raw(self, data: bytes) -> Client:
        """Send raw bytes on a new client connection; flush."""
        client = self.net.client(self.sites.proxy)
        client.transport.write(data)
        self.net.flush()
        return client

    def post(self, path: str, body: bytes, **headers: str) -> Client:
        """Send one POST on a new client connection; flush."""
        return self.send("POST", path, body, {"Content-Type": "application/json", **headers})

    def send(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> Client:
        """Send one request on a new client connection; flush."""
        client = self.net.client(self.sites.proxy)
        head = f"{method} {path} HTTP/1.1\r\nHost: crossbar\r\n"
        for name, value in (headers or {}).items():
            head += f"{name}: {value}\r\n"
        if body or method == "POST":
            head += f"Content-Length: {len(body)}\r\n"
        client.transport.write(head.encode("latin-1") + b"\r\n" + body)
        self.net.flush()
        return client


def sse(host: Host, events: int) -> None:
    """Start a chunked SSE answer on `host` and send `events` token events (no usage), then
    hold: the stream is neither ended nor cut until the test says so."""
    host.transport.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    for i in range(events):
        event = b'data: {"id": "c1", "choices": [{"delta": {"content": "t%d"}}]}\n\n' % i
        host.transport.write(b"%x\r\n%s\r\n" % (len(event), event))


def chat(text: str = "hello") -> bytes:
    return (
        b'{"model": "'
        + MODEL.encode()
        + b'", "messages": [{"role": "user", "content": "'
        + text.encode()
        + b'"}]}'
    )


def start(
    routes: dict[str, Any],
    hosts: tuple[str, ...] = ("titan", "atlas"),
    parallel: int = 2,
    keys: dict[str, Any] | None = None,
    net: Net | None = None,
    store: MemoryStore | None = None,
    host_tables: dict[str, dict[str, Any]] | None = None,
    **server: Any,
) -> Crossbar:
    """crossbar with `hosts` (`parallel` slots each) on a new in-memory net (or `net`, beside
    the crossbars already on it; with `store`, sharing theirs: instances of one fleet).
    `host_tables`: the hosts' own config tables instead (their URLs `http://<name>:8080`)."""
    net = net or Net()
    tables = {
        h: {"url": f"http://{h}:8080", "models": [MODEL], "parallel": parallel} for h in hosts
    }
    if host_tables is not None:
        tables = {h: {"url": f"http://{h}:8080", **t} for h, t in host_tables.items()}
    config = parse_config(
        {
            "server": {"db": ":memory:", **server},
            "hosts": tables,
            "routes": routes,
            "keys": keys or {},
        }
    )
    store = store if store is not None else MemoryStore()
    parts = run_now(build_parts(config, net.clock, store=store, endpoints=net.endpoints()))

    async def no_reload() -> list[str]:
        return []

    return Crossbar(net, parts, make_sites(config, parts, no_reload), store)


def _unchunk(data: bytes) -> bytes:
    out = b""
    while data:
        size, _, rest = data.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out += rest[:n]
        data = rest[n + 2 :]
    return out
