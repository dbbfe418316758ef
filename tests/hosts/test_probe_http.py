"""The lean probe getter (probe_http.py): a bare GET /health on one kept connection per host,
read in memory (a MemoryReactor's connections on StringTransports) and once against a real
fake llama-server."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import globalLogPublisher
from twisted.python.failure import Failure

from crossbar.config.values import parse_config
from crossbar.hosts.health import Prober, failure_reason
from crossbar.hosts.lean_get import LeanGetter
from crossbar.hosts.registry import Hosts
from tests.support.harness import MODEL, start_fakes, wait

URL = "http://10.0.0.7:8080"
OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{"status":"ok"}'


class Fallback:
    """The treq getter's stand-in: records what it was asked and answers (299, b"fallback")."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, dict[str, str]]] = []
        self.pending: list[Deferred[tuple[int, bytes]]] = []

    def __call__(self, url: str, headers: Mapping[str, str]) -> Deferred[tuple[int, bytes]]:
        self.asked.append((url, dict(headers)))
        d: Deferred[tuple[int, bytes]] = Deferred()
        self.pending.append(d)
        d.callback((299, b"fallback"))
        return d


class Net:
    """A LeanGetter on a memory reactor: `accept()` completes the newest connection attempt."""

    def __init__(self) -> None:
        self.reactor = MemoryReactorClock()
        self.fallback = Fallback()
        self.get = LeanGetter(self.reactor, self.fallback)
        self.accepted = 0
        self.transport = StringTransport()
        self.protocol: Any = None

    def accept(self) -> StringTransport:
        assert len(self.reactor.tcpClients) == self.accepted + 1, "no new connection attempt"
        host, port, factory, *_ = self.reactor.tcpClients[self.accepted]
        assert (host, port) == ("10.0.0.7", 8080)
        self.accepted += 1
        self.protocol = factory.buildProtocol(None)
        self.transport = StringTransport()
        self.protocol.makeConnection(self.transport)
        return self.transport

    def answer(self, data: bytes, step: int = 0) -> None:
        """The host's bytes, all at once or `step` bytes at a time."""
        chunks = [data] if not step else [data[i : i + step] for i in range(0, len(data), step)]
        for chunk in chunks:
            self.protocol.dataReceived(chunk)

    def close(self, reason: Exception) -> None:
        self.protocol.connectionLost(Failure(reason))


def result(d: Deferred[Any]) -> Any:
    out: list[Any] = []
    d.addBoth(out.append)
    assert out, "the probe has not finished"
    if isinstance(out[0], Failure):
        return out[0].value
    return out[0]


def test_a_probe_is_one_bare_get_and_the_connection_is_kept_for_the_next():
    net = Net()
    d = net.get(URL + "/health", {"Authorization": "Bearer s3cret"})
    transport = net.accept()
    assert transport.value() == (
        b"GET /health HTTP/1.1\r\nHost: 10.0.0.7:8080\r\nAuthorization: Bearer s3cret\r\n\r\n"
    )
    net.answer(OK)
    assert result(d) == (200, b'{"status":"ok"}')
    assert not transport.disconnecting

    transport.clear()
    d = net.get(URL + "/health", {})
    assert len(net.reactor.tcpClients) == 1  # no new connection
    assert transport.value() == b"GET /health HTTP/1.1\r\nHost: 10.0.0.7:8080\r\n\r\n"
    net.answer(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 7\r\n\r\nLoading", step=3)
    assert result(d) == (503, b"Loading")
    assert net.get.connects == 1 and net.fallback.asked == []


def test_a_chunked_answer_is_read_whole_however_it_arrives():
    net = Net()
    body = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    body += b'5\r\n{"sta\r\nA;ext=1\r\ntus":"ok"}\r\n0\r\nX-Trailer: 1\r\n\r\n'
    for step in (1, 7, 0):
        d = net.get(URL + "/health", {})
        if net.protocol is None:
            net.accept()
        net.answer(body, step=step)
        assert result(d) == (200, b'{"status":"ok"}')
    assert net.get.connects == 1


def test_connection_close_ends_the_connection_and_the_next_probe_opens_another():
    net = Net()
    d = net.get(URL + "/health", {})
    first = net.accept()
    net.answer(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
    assert result(d) == (200, b"ok")
    assert first.disconnecting
    net.close(ConnectionDone())

    d = net.get(URL + "/health", {})
    net.accept()  # a new connection
    net.answer(b"HTTP/1.0 200 OK\r\n\r\nup to the close")  # HTTP/1.0, no length: to the close
    assert not d.called
    net.close(ConnectionDone())
    assert result(d) == (200, b"up to the close")
    assert net.get.connects == 2


def test_a_cancelled_probe_drops_its_connection_and_the_next_one_reconnects():
    net = Net()
    prober = Prober(net.get, net.reactor, within=2.0)
    host = parse_config({"hosts": {"a": {"url": URL, "models": ["m"]}}}).hosts["a"]
    probe = Deferred.fromCoroutine(prober.check(host))
    transport = net.accept()
    net.reactor.advance(2.0)  # health_timeout: no answer
    assert result(probe).reason.startswith("timeout")
    assert transport.disconnected  # aborted, not left to answer later

    probe = Deferred.fromCoroutine(prober.check(host))
    net.accept()
    net.answer(OK)
    assert result(probe).ok


def test_cancelling_while_connecting_stops_the_connection_attempt():
    net = Net()
    d = net.get(URL + "/health", {})
    d.cancel()
    assert isinstance(result(d), CancelledError)
    assert net.reactor.connectors[0].stoppedConnecting


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (b"", "reset (connection closed before a response)"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "reset (connection lost)"),
    ],
)
def test_a_connection_lost_fails_the_probe_and_the_next_one_reconnects(answer, reason):
    net = Net()
    d = net.get(URL + "/health", {})
    net.accept()
    net.answer(answer)
    net.close(ConnectionLost())
    assert failure_reason(result(d)).startswith(reason)

    d = net.get(URL + "/health", {})
    net.accept()
    net.answer(OK)
    assert result(d)[0] == 200


def test_a_kept_connection_the_host_closed_meanwhile_is_retried_once_on_a_new_one():
    net = Net()
    d = net.get(URL + "/health", {})
    net.accept()
    net.answer(OK)
    result(d)
    d = net.get(URL + "/health", {})
    net.close(ConnectionDone())  # the host's idle timeout crossed our request
    net.accept()
    net.answer(OK)
    assert result(d)[0] == 200
    assert net.get.connects == 2


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000,
    ],
)
def test_an_unusual_answer_drops_the_connection_and_goes_to_the_fallback(answer):
    net = Net()
    d = net.get(URL + "/health", {"Authorization": "Bearer k"})
    transport = net.accept()
    net.answer(answer)
    assert result(d) == (299, b"fallback")
    assert net.fallback.asked == [(URL + "/health", {"Authorization": "Bearer k"})]
    assert transport.disconnected


@pytest.mark.parametrize(
    ("url", "headers"),
    [
        (URL + "/props", {}),
        ("https://10.0.0.7:8080/health", {}),
        (URL + "/health?x=1", {}),
        (URL + "/health", {"Authorization": "Bearer a\r\nX-Injected: 1"}),
    ],
)
def test_other_requests_go_to_the_fallback_untouched(url, headers):
    net = Net()
    assert result(net.get(url, headers)) == (299, b"fallback")
    assert net.fallback.asked == [(url, headers)] and net.reactor.tcpClients == []


def test_a_second_request_while_one_is_under_way_goes_to_the_fallback():
    net = Net()
    first = net.get(URL + "/health", {})
    net.accept()
    assert result(net.get(URL + "/health", {})) == (299, b"fallback")
    net.answer(OK)
    assert result(first)[0] == 200
    assert len(net.reactor.tcpClients) == 1


@pytest_twisted.ensureDeferred
async def test_probes_of_a_fake_llama_server_share_one_connection_and_log_no_factory_lines():
    fake = (await start_fakes("titan", parallel=2, ctx=2048))["titan"]
    host = {"url": fake.url, "models": [MODEL], "api_key": "k1"}
    config = parse_config(
        {
            "server": {"unhealthy_after": 1, "healthy_after": 1, "health_timeout": "2s"},
            "hosts": {"titan": host},
        }
    )
    factories: list[str] = []  # modules of the factories that logged "Starting factory"...

    def observer(event: dict[str, Any]) -> None:
        if "factory" in str(event.get("log_format")).lower():
            factories.append(type(event.get("factory")).__module__)

    globalLogPublisher.addObserver(observer)
    hosts = Hosts(config, reactor)
    try:
        for _ in range(4):
            await wait(hosts.probe_all())
        assert hosts.healthy("titan")
        assert hosts.parallel("titan", MODEL) == 2  # /props, read through treq
        lean: LeanGetter = hosts._get  # type: ignore[assignment]
        assert lean.connects == 1

        fake.faults.loading = True
        await wait(hosts.probe_all())
        assert not hosts.healthy("titan")
        assert "Loading model" in hosts.status()[0]["reason"]

        fake.faults.loading = False
        fake.faults.refuse = True
        await fake.settle()  # drops our kept connection too
        await wait(hosts.probe_all())
        assert hosts.status()[0]["last_probe"]["reason"] == "refused"

        fake.faults.refuse = False
        await fake.settle()
        await wait(hosts.probe_all())
        assert hosts.healthy("titan")
        # Only the fake's listener, which `refuse` closes and opens, logs its factory.
        assert set(factories) == {"crossbar.testing.fakellama", "twisted.web.server"}
    finally:
        globalLogPublisher.removeObserver(observer)
        await hosts.stop()
        await fake.stop()
