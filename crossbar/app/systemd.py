"""systemd's notify protocol: READY=1 once crossbar listens, STOPPING=1 when it stops, and
WATCHDOG=1 from a reactor timer, so a frozen process (SIGSTOP, a stuck reactor) is killed and
restarted by systemd instead of holding its share of a `reuseport:` port that the kernel
keeps handing connections to (docs/operator-guide.md, "Running several instances").

Only where systemd asked for it: `NOTIFY_SOCKET` names its datagram socket (an abstract one
when it starts with "@"), `WATCHDOG_USEC` the watchdog's period, `WATCHDOG_PID` (when set) the
process it watches. Pings go every half period, from the reactor's own timer: a reactor that
does not turn sends none. A failed send is logged once and never raised.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

from twisted.application.internet import TimerService
from twisted.logger import Logger

log = Logger(namespace="crossbar.systemd")


class Notifier:
    """Sends state lines to systemd's `NOTIFY_SOCKET`."""

    def __init__(self, address: str) -> None:
        self._address = "\0" + address[1:] if address.startswith("@") else address
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._socket.setblocking(False)
        self._failed = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> Notifier | None:
        """A notifier when systemd runs crossbar as `Type=notify`, else None."""
        address = environ.get("NOTIFY_SOCKET", "")
        return cls(address) if address else None

    def send(self, state: str) -> None:
        """One datagram, e.g. "READY=1"; a failure is logged once and never raised."""
        try:
            self._socket.sendto(state.encode(), self._address)
        except OSError as e:
            if not self._failed:
                self._failed = True
                log.warn("cannot tell systemd {state}: {error}", state=state, error=e)

    def close(self) -> None:
        self._socket.close()


def watchdog_period(environ: Mapping[str, str] = os.environ) -> float | None:
    """Seconds between pings (half the watchdog's period), when systemd watches this
    process; else None."""
    usec = environ.get("WATCHDOG_USEC", "")
    pid = environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) <= 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 1_000_000 / 2


class Watchdog(TimerService):
    """WATCHDOG=1 every `period` seconds on `clock` (the reactor)."""

    def __init__(self, notifier: Notifier, period: float, clock: Any) -> None:
        super().__init__(period, notifier.send, "WATCHDOG=1")
        self.setName("watchdog")
        self.clock = clock
