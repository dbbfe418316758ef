"""A TCP forwarder in front of PostgreSQL that a test can shut (every connection cut, new ones
refused) and open again on the same port: the database going away and coming back; or
silence (nothing forwarded either way, every connection left open): a database that is
alive but does not answer, as behind a network that drops packets."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from twisted.internet import reactor
from twisted.internet.defer import maybeDeferred
from twisted.internet.interfaces import IListeningPort
from twisted.protocols.portforward import ProxyFactory, ProxyServer


class _Tracked(ProxyServer):
    noisy = False

    def connectionMade(self) -> None:
        self.factory.open_connections.add(self)
        super().connectionMade()
        if self.factory.silent:
            self.transport.pauseProducing()

    def connectionLost(self, reason: object) -> None:
        self.factory.open_connections.discard(self)
        super().connectionLost(reason)


class _Forwarder(ProxyFactory):
    protocol = _Tracked
    noisy = False

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)
        self.open_connections: set[_Tracked] = set()
        self.silent = False


class DatabaseGate:
    """Forwards 127.0.0.1:`port` (picked at `open`) to the database of `url`."""

    def __init__(self, url: str, password: str = "") -> None:
        """`password`: put into the gate's URL (trust auth ignores it; logs must not show it)."""
        parts = urlsplit(url)
        self._password = password
        self._url = parts
        self._factory = _Forwarder(parts.hostname or "127.0.0.1", parts.port or 5432)
        self._listening: IListeningPort | None = None
        self.port = 0

    @property
    def url(self) -> str:
        """The database's URL through this gate."""
        user = self._url.username or ""
        if user and self._password:
            user += ":" + self._password
        user += "@" if user else ""
        return urlunsplit(self._url._replace(netloc=f"{user}127.0.0.1:{self.port}"))

    def open(self) -> None:
        """Listen (on the port of the first opening, every time)."""
        self._listening = reactor.listenTCP(self.port, self._factory, interface="127.0.0.1")
        self.port = self._listening.getHost().port

    async def shut(self) -> None:
        """Refuse new connections and cut every open one."""
        if self._listening is not None:
            await maybeDeferred(self._listening.stopListening)
            self._listening = None
        for server in list(self._factory.open_connections):
            server.transport.abortConnection()
            if server.peer is not None:
                server.peer.transport.abortConnection()

    def silence(self) -> None:
        """Forward nothing either way and leave every connection open (new ones too)."""
        self._factory.silent = True
        for server in self._factory.open_connections:
            server.transport.pauseProducing()
            if server.peer is not None:
                server.peer.transport.pauseProducing()

    def speak(self) -> None:
        """Forward again what waited, and what comes."""
        self._factory.silent = False
        for server in self._factory.open_connections:
            server.transport.resumeProducing()
            if server.peer is not None:
                server.peer.transport.resumeProducing()
