"""`reuseport:` endpoints: several listeners (processes, here ports in one process) on one TCP
port; the kernel spreads connections over all of them, and when one stops the rest take all."""

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred, DeferredList, maybeDeferred
from twisted.internet.endpoints import TCP4ClientEndpoint, serverFromString
from twisted.internet.error import CannotListenError
from twisted.internet.protocol import Factory, Protocol

from crossbar.app.reuseport import ReusePortEndpoint
from crossbar.config.values import ConfigError, parse_config
from tests.support.harness import wait


class _Hello(Protocol):
    """Says which listener took the connection, then hangs up."""

    def connectionMade(self) -> None:
        self.transport.write(self.factory.name.encode())
        self.transport.loseConnection()


class _Reader(Protocol):
    def __init__(self) -> None:
        self.said = b""
        self.done: Deferred[str] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.said += data

    def connectionLost(self, reason: object) -> None:
        self.done.callback(self.said.decode())


def _listener(name: str) -> Factory:
    factory = Factory.forProtocol(_Hello)
    factory.name = name
    return factory


async def _who_answers(port: int, n: int) -> list[str]:
    """Which listener took each of `n` fresh connections to `port`."""
    readers = []
    for _ in range(n):
        client = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
        readers.append(await wait(client.connect(Factory.forProtocol(_Reader))))
    answers = await wait(DeferredList([r.done for r in readers], fireOnOneErrback=True))
    return [said for _, said in answers]


@pytest_twisted.ensureDeferred
async def test_two_listeners_share_one_port_and_the_survivor_takes_all():
    first = await wait(
        serverFromString(reactor, "reuseport:0:interface=127.0.0.1").listen(_listener("a"))
    )
    port = first.getHost().port
    second = await wait(
        serverFromString(reactor, f"reuseport:{port}:interface=127.0.0.1").listen(_listener("b"))
    )
    try:
        assert second.getHost().port == port
        # The kernel hashes each connection's addresses onto a listener: 40 connections from
        # fresh client ports land on both (all on one would be a 1-in-2^39 chance).
        assert set(await _who_answers(port, 40)) == {"a", "b"}
        await first.stopListening()
        assert set(await _who_answers(port, 20)) == {"b"}
    finally:
        await maybeDeferred(first.stopListening)
        await maybeDeferred(second.stopListening)


@pytest_twisted.ensureDeferred
async def test_a_plain_tcp_listener_cannot_take_a_reuseport_port():
    shared = await wait(ReusePortEndpoint(reactor, 0, "127.0.0.1").listen(_listener("a")))
    port = shared.getHost().port
    try:
        with pytest.raises(CannotListenError):
            await wait(serverFromString(reactor, f"tcp:{port}:interface=127.0.0.1").listen(
                _listener("b")))  # fmt: skip
    finally:
        await shared.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_port_held_without_reuseport_is_refused_with_the_reason():
    plain = reactor.listenTCP(0, _listener("a"), interface="127.0.0.1")
    port = plain.getHost().port
    try:
        with pytest.raises(CannotListenError, match="Address already in use"):
            await wait(ReusePortEndpoint(reactor, port, "127.0.0.1").listen(_listener("b")))
    finally:
        await plain.stopListening()


@pytest_twisted.ensureDeferred
async def test_an_ipv6_interface_listens_on_ipv6():
    try:
        listening = await wait(ReusePortEndpoint(reactor, 0, "::1").listen(_listener("a")))
    except CannotListenError as e:  # a machine without IPv6 loopback
        pytest.skip(f"no ::1 here: {e}")
    try:
        assert listening.getHost().type == "TCP" and listening.getHost().host == "::1"
    finally:
        await listening.stopListening()


def test_the_config_takes_reuseport_listen_strings_and_names_a_bad_one():
    hosts = {"titan": {"url": "http://127.0.0.1:9", "models": ["m"]}}
    config = parse_config(
        {"server": {"listen": "reuseport:8080:interface=0.0.0.0"}, "hosts": hosts}
    )
    assert config.server.listen == "reuseport:8080:interface=0.0.0.0"
    with pytest.raises(ConfigError, match=r"server\.listen: not a Twisted endpoint string"):
        parse_config({"server": {"listen": "reuseport:http"}, "hosts": hosts})
