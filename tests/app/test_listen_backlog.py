"""Both ports listen with `listen_backlog` (Twisted's default of 50 left a burst of clients
waiting on SYN retries), unless their endpoint string sets `backlog=` itself."""

import socket

import pytest
from twisted.internet.endpoints import serverFromString
from twisted.internet.testing import MemoryReactorClock

from crossbar.app import reuseport
from crossbar.app.reuseport import ReusePortEndpoint
from crossbar.app.service import make_service
from crossbar.config import with_backlog
from crossbar.config.values import ConfigError, parse_config
from tests.support.lease_fakes import MemoryStore


def config(**server):
    return parse_config(
        {
            "server": {
                "listen": "tcp:8080:interface=127.0.0.1",
                "admin_listen": "tcp:8081:interface=127.0.0.1",
                **server,
            },
            "hosts": {"titan": {"url": "http://127.0.0.1:9", "models": ["m"]}},
            "routes": {"convo": {"hosts": ["titan"]}},
        }
    )


def backlogs(**server) -> list[tuple[int, int]]:
    """(port, backlog) of every TCP port the service listens on."""
    reactor = MemoryReactorClock()
    service = make_service(config(**server), reactor, store=MemoryStore())
    service.startService()
    reactor.advance(2)  # the first probe round ends; the ports open
    assert service.ready.called
    service.stopService()
    reactor.advance(0)
    return [(port, backlog) for port, _, backlog, _ in reactor.tcpServers]


def test_both_ports_listen_with_a_backlog_of_1024_by_default():
    assert backlogs() == [(8080, 1024), (8081, 1024)]


def test_listen_backlog_sets_both_ports_backlog():
    assert backlogs(listen_backlog=4096) == [(8080, 4096), (8081, 4096)]


def test_a_backlog_in_the_endpoint_string_is_kept():
    ports = backlogs(listen="tcp:8080:backlog=128:interface=127.0.0.1", listen_backlog=2048)
    assert ports == [(8080, 128), (8081, 2048)]


class _Listening(socket.socket):
    """A real socket that says what `listen` was asked for."""

    backlogs: list[int] = []

    def listen(self, backlog: int = 0) -> None:
        _Listening.backlogs.append(backlog)
        super().listen(backlog)


def test_a_reuseport_listener_takes_listen_backlog_too(monkeypatch):
    _Listening.backlogs = []
    monkeypatch.setattr(reuseport.socket, "socket", _Listening)
    reactor = MemoryReactorClock()
    service = make_service(
        config(listen="reuseport:0:interface=127.0.0.1", listen_backlog=333),
        reactor,
        store=MemoryStore(),
    )
    service.startService()
    reactor.advance(2)
    assert service.ready.called
    assert _Listening.backlogs == [333] and len(reactor.adoptedPorts) == 1
    assert [backlog for _, _, backlog, _ in reactor.tcpServers] == [333]  # the admin port
    service.stopService()
    reactor.advance(0)


@pytest.mark.parametrize(
    ("description", "built"),
    [
        ("tcp:8080", "tcp:8080:backlog=1024"),
        ("tcp:8080:interface=127.0.0.1", "tcp:8080:interface=127.0.0.1:backlog=1024"),
        ("tcp:8080:backlog=7", "tcp:8080:backlog=7"),
        ("tcp:8080:0.0.0.0:7", "tcp:8080:0.0.0.0:7"),  # by position
        ("reuseport:8080:7", "reuseport:8080:7"),
        ("tcp6:8080:interface=\\:\\:1", "tcp6:8080:interface=\\:\\:1:backlog=1024"),
        ("reuseport:8080", "reuseport:8080:backlog=1024"),
        ("unix:/run/crossbar.sock", "unix:/run/crossbar.sock:backlog=1024"),
        ("ssl:8443:privateKey=k.pem", "ssl:8443:privateKey=k.pem:backlog=1024"),
        ("systemd:domain=INET:index=0", "systemd:domain=INET:index=0"),  # takes none
    ],
)
def test_the_endpoint_string_gets_the_backlog_where_its_kind_takes_one(description, built):
    assert with_backlog(description, 1024) == built


def test_the_reuseport_endpoint_is_made_with_the_backlog():
    endpoint = serverFromString(MemoryReactorClock(), with_backlog("reuseport:8080", 1024))
    assert isinstance(endpoint, ReusePortEndpoint) and endpoint.backlog == 1024


@pytest.mark.parametrize(
    ("server", "error"),
    [
        ({"listen_backlog": 0}, "server.listen_backlog: must be at least 1, not 0"),
        ({"listen_backlog": 70000}, "server.listen_backlog: must be at most 65535, not 70000"),
        ({"listen_backlog": "many"}, "server.listen_backlog: must be an integer, not a string"),
    ],
)
def test_a_bad_listen_backlog_is_a_config_error(server, error):
    with pytest.raises(ConfigError) as raised:
        config(**server)
    assert error in raised.value.errors
