"""The service as twistd builds it, on a MemoryReactorClock: what it is made of, and in what
order it starts and stops (no socket, no thread: the reactor only records)."""

from twisted.application.internet import StreamServerEndpointService, TimerService
from twisted.internet.error import CannotListenError
from twisted.internet.testing import MemoryReactorClock

from crossbar.app.service import make_service
from crossbar.app.tap import Options, makeService
from crossbar.config.values import parse_config
from crossbar.hosts.schedule import ProbeSchedule
from tests.support.lease_fakes import MemoryStore

CONFIG = {
    "server": {
        "listen": "tcp:8080:interface=127.0.0.1",
        "admin_listen": "tcp:8081:interface=127.0.0.1",
        "health_interval": "5s",
        "health_timeout": "2s",
        "sweep_interval": "30s",
        "shutdown_grace": "1s",
    },
    "hosts": {"titan": {"url": "http://127.0.0.1:9", "models": ["m"]}},
    "routes": {"convo": {"hosts": ["titan"]}},
}


def listening(reactor: MemoryReactorClock) -> list[tuple[int, str]]:
    return [(port, interface) for port, _, _, interface in reactor.tcpServers]


def test_the_proxy_port_opens_only_after_the_first_probe_round():
    reactor, store = MemoryReactorClock(), MemoryStore()
    service = make_service(parse_config(CONFIG), reactor, store=store)
    service.startService()
    # The first round probes titan, which never answers here...
    assert [s.name for s in service] == []
    assert [c[:2] for c in reactor.tcpClients] == [("127.0.0.1", 9)]
    assert listening(reactor) == [] and not service.ready.called
    reactor.advance(2)  # ...until health_timeout ends the round.
    assert service.ready.called
    assert listening(reactor) == [(8080, "127.0.0.1"), (8081, "127.0.0.1")]
    timers = ["probes", "sweep", "follow", "heartbeat", "keys", "rebalance", "batches"]
    assert [s.name for s in service] == [*timers, "proxy", "admin"]
    kinds = [type(s) for s in service]
    assert kinds[7:] == [StreamServerEndpointService] * 2
    assert kinds[0] is ProbeSchedule  # each host at its own phase of health_interval
    assert all(issubclass(k, TimerService) for k in kinds[1:7])
    assert service.getServiceNamed("probes").interval == 5.0
    steps = [service.getServiceNamed(n).step for n in timers[1:]]
    assert steps == [30.0, 0.25, 5.0, 1.0, 1.0, 1.0]
    service.stopService()
    reactor.advance(0)
    assert store.closed


def test_the_timers_run_on_the_injected_clock():
    reactor = MemoryReactorClock()
    service = make_service(parse_config(CONFIG), reactor, store=MemoryStore())
    service.startService()
    reactor.advance(2)
    probes = len(reactor.tcpClients)
    reactor.advance(5)  # one health_interval later, a new round
    assert len(reactor.tcpClients) == probes + 1
    service.stopService()


class PortTaken(MemoryReactorClock):
    def listenTCP(self, port, factory, backlog=50, interface=""):
        if port == 8080:
            raise CannotListenError(interface, port, OSError("address already in use"))
        return super().listenTCP(port, factory, backlog, interface)


def test_a_port_that_cannot_be_opened_fails_the_start_and_opens_nothing_else():
    reactor = PortTaken()
    service = make_service(parse_config(CONFIG), reactor, store=MemoryStore())
    failures = []
    service.ready.addErrback(failures.append)
    service.startService()
    reactor.advance(2)
    (failure,) = failures
    assert failure.check(CannotListenError)
    assert listening(reactor) == []  # the admin port never opened
    service.stopService()


def test_twistd_makes_the_service_from_the_config_file(tmp_path):
    path = tmp_path / "crossbar.toml"
    path.write_text(
        '[server]\ndb = ":memory:"\n[hosts.titan]\nurl = "http://127.0.0.1:9"\nmodels = ["m"]\n'
        '[routes.convo]\nhosts = ["titan"]\n'
    )
    options = Options()
    options.parseOptions(["-c", str(path)])
    service = makeService(options)
    assert service.config.path == str(path)
    assert not service.running and list(service) == []  # children come at start
