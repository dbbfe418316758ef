"""A TCP server endpoint with `SO_REUSEPORT`, so N crossbar processes share one port.

`reuseport:8080:interface=0.0.0.0` (the plugin in `twisted/plugins/crossbar_reuseport.py`
registers the prefix) binds a socket with `SO_REUSEADDR` and `SO_REUSEPORT`, listens, and hands
it to the reactor with `adoptStreamPort`. The kernel then spreads new connections across every
process listening on that port with the same user id; when one stops, the others take all.
"""

from __future__ import annotations

import socket
from typing import Any

from attrs import frozen
from twisted.internet.defer import Deferred, execute
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import (
    IListeningPort,
    IReactorSocket,
    IStreamServerEndpoint,
    IStreamServerEndpointStringParser,
)
from twisted.plugin import IPlugin
from zope.interface import implementer


@implementer(IStreamServerEndpoint)
@frozen
class ReusePortEndpoint:
    """Listen on `interface:port` with `SO_REUSEPORT`; other processes may listen there too."""

    reactor: IReactorSocket
    port: int
    interface: str = ""
    backlog: int = 50

    def listen(self, factory: Any) -> Deferred[IListeningPort]:
        """Bind, listen and adopt the socket; a CannotListenError says why not."""
        return execute(self._listen, factory)

    def _listen(self, factory: Any) -> IListeningPort:
        option = getattr(socket, "SO_REUSEPORT", None)
        if option is None:
            raise CannotListenError(self.interface, self.port, "SO_REUSEPORT is not supported here")
        family = socket.AF_INET6 if ":" in self.interface else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Twisted's own ports
            sock.setsockopt(socket.SOL_SOCKET, option, 1)
            sock.bind((self.interface, self.port))
            sock.listen(self.backlog)
            sock.setblocking(False)
            return self.reactor.adoptStreamPort(sock.fileno(), family, factory)
        except OSError as e:
            raise CannotListenError(self.interface, self.port, e) from e
        finally:
            sock.close()  # the reactor's port holds its own duplicate of the descriptor


@implementer(IPlugin, IStreamServerEndpointStringParser)
class ReusePortParser:
    """`reuseport:PORT[:interface=ADDRESS][:backlog=N]`, as `tcp:` takes them."""

    prefix = "reuseport"

    def parseStreamServer(
        self, reactor: Any, port: str, backlog: str = "50", interface: str = ""
    ) -> ReusePortEndpoint:
        """The endpoint for one description; bad numbers raise ValueError (a config error)."""
        return ReusePortEndpoint(reactor, int(port), interface, int(backlog))
