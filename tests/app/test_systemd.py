"""crossbar under systemd's notify protocol: READY=1 once it listens, WATCHDOG=1 from its
reactor every half watchdog period, STOPPING=1 when it stops; a frozen process sends nothing,
so systemd kills and restarts it. Nothing is sent where systemd did not ask."""

import os
import signal

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.protocol import DatagramProtocol
from twisted.internet.task import Clock, deferLater

from crossbar.app.systemd import Notifier, Watchdog, watchdog_period
from crossbar.demo.launch import free_ports
from tests.support.harness import start_fakes
from tests.support.twistd import config_text, exited, spawn_twistd, until_status


class Heard(DatagramProtocol):
    """What arrived on the notify socket, with when (reactor seconds)."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []

    def datagramReceived(self, data: bytes, addr: object) -> None:
        self.lines.append((reactor.seconds(), data.decode()))

    def said(self, state: str) -> list[float]:
        return [at for at, line in self.lines if line == state]


def test_the_watchdog_is_asked_for_by_systemd_only():
    assert watchdog_period({}) is None
    assert watchdog_period({"WATCHDOG_USEC": "10000000"}) == 5.0  # pings at half the period
    assert watchdog_period({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "1"}) is None  # not us
    mine = {"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    assert watchdog_period(mine) == 1.0
    assert Notifier.from_environ({}) is None


def test_the_watchdog_pings_from_the_reactors_timer(tmp_path):
    heard = Heard()
    port = reactor.listenUNIXDatagram(str(tmp_path / "notify"), heard)
    sent = []

    class Recording(Notifier):
        def send(self, state: str) -> None:
            sent.append(state)

    clock = Clock()
    dog = Watchdog(Recording(str(tmp_path / "notify")), 1.0, clock)
    dog.startService()
    clock.pump([1.0, 1.0, 1.0])
    assert sent == ["WATCHDOG=1"] * 4  # at once, then each period; nothing while the clock stands
    dog.stopService()
    port.stopListening()


def test_a_notifier_without_systemd_listening_logs_once_and_raises_nothing(tmp_path):
    notifier = Notifier(str(tmp_path / "nobody"))
    notifier.send("READY=1")
    notifier.send("WATCHDOG=1")  # no exception, no second warning
    notifier.close()


@pytest_twisted.ensureDeferred
async def test_a_frozen_crossbar_stops_pinging_and_a_running_one_says_ready_and_stopping(tmp_path):
    heard = Heard()
    socket_path = str(tmp_path / "notify")
    listening = reactor.listenUNIXDatagram(socket_path, heard)
    fakes = await start_fakes("titan")
    port, admin = free_ports(2)
    path = tmp_path / "crossbar.toml"
    path.write_text(config_text(port, admin, tmp_path / "c.db", fakes["titan"].url, ["convo"]))
    env = {"NOTIFY_SOCKET": socket_path, "WATCHDOG_USEC": "400000", "WATCHDOG_PID": ""}
    process = spawn_twistd(path, tmp_path / "crossbar.log", env)
    try:
        await until_status(f"http://127.0.0.1:{port}/r/convo/health", 200)
        await deferLater(reactor, 1.0, lambda: None)
        assert heard.said("READY=1")
        pings = heard.said("WATCHDOG=1")
        assert len(pings) >= 3  # every 0.2 s
        process.send_signal(signal.SIGSTOP)
        stopped = reactor.seconds()
        await deferLater(reactor, 1.0, lambda: None)
        assert [at for at in heard.said("WATCHDOG=1") if at > stopped + 0.1] == []
        process.send_signal(signal.SIGCONT)
        await deferLater(reactor, 1.0, lambda: None)
        assert [at for at in heard.said("WATCHDOG=1") if at > stopped + 1.0]  # alive again
        process.send_signal(signal.SIGTERM)
        assert await exited(process) in (0, -signal.SIGTERM)
        assert heard.said("STOPPING=1")
    finally:
        if process.poll() is None:
            process.kill()
        listening.stopListening()
        await fakes["titan"].stop()
