"""The upstream client: a persistent pool, failure classification, and the streaming relay."""

from __future__ import annotations

from typing import Any

from attrs import frozen
from twisted.internet import defer
from twisted.internet import error as ierror
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web import client
from twisted.web._newclient import (
    HTTP11ClientProtocol,
    RequestNotSent,
    RequestTransmissionFailed,
    ResponseFailed,
    ResponseNeverReceived,
)
from twisted.web.client import (
    Agent,
    BrowserLikePolicyForHTTPS,
    HTTPConnectionPool,
    ResponseDone,
    _HTTP11ClientFactory,
    _StandardEndpointFactory,
)
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory, IBodyProducer, IResponse
from zope.interface import implementer

from crossbar.errors import ClientError, unavailable

# RFC 9110 §7.6.1: never forwarded in either direction (plus whatever Connection names).
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
    }
)


def hop_by_hop(headers: Headers, connection: Headers | None = None) -> set[bytes]:
    """The header names not to forward: the fixed set, `Proxy-*`, and those Connection names
    (read from `connection` where the client library files them apart)."""
    names = set(HOP_BY_HOP)
    for value in (connection or headers).getRawHeaders(b"connection", []):
        names.update(t.strip().lower() for t in value.split(b",") if t.strip())
    for name, _ in headers.getAllRawHeaders():
        if name.lower().startswith(b"proxy-"):
            names.add(name.lower())
    return names


@frozen
class UpstreamFailure(Exception):
    """No response byte came from the host.

    `host_fault`: a fresh connection was refused, timed out connecting or was reset, so the
    host is down (a restarted llama-server has lost its cache anyway). `reused`: it happened on
    a pooled connection, which is a keep-alive race to retry on a fresh one, not a host fault.
    """

    reason: str
    host_fault: bool
    reused: bool = False

    def client_error(self, host: str) -> ClientError:
        if self.reason == "idle timeout":
            return ClientError(504, "api_error", f"host {host} sent nothing in time; try again")
        if self.reason == "refused":
            return unavailable(
                f"host {host} refused the connection and no other host could take the request",
                retry_after=5,
                status=502,
            )
        return unavailable(f"host {host} failed ({self.reason}); try again shortly", 5)


def classify(failure: Failure, reused: bool) -> UpstreamFailure | None:
    """Map a request failure to an UpstreamFailure, or None when it is something else."""
    if failure.check(defer.TimeoutError):
        # Never retried: a silent host is not a keep-alive race, and resending doubles its work.
        return UpstreamFailure("idle timeout", host_fault=False)
    if failure.check(ierror.ConnectionRefusedError):
        return UpstreamFailure("refused", host_fault=True)
    if failure.check(ierror.TimeoutError):
        return UpstreamFailure("connect timeout", host_fault=True)
    if failure.check(ierror.ConnectError, ierror.DNSLookupError):
        return UpstreamFailure("connect failed", host_fault=True)
    if failure.check(
        ResponseNeverReceived, RequestTransmissionFailed, RequestNotSent, ResponseFailed
    ):
        # No response (or only part of its head) arrived: to the client, nothing was sent yet.
        return UpstreamFailure("reset", host_fault=not reused, reused=reused)
    return None


@implementer(IAgentEndpointFactory)
class _CachedEndpoints:
    """Twisted's endpoints for http and https, made once per host instead of per request
    (building one IDNA-encodes the host name: a few percent of the proxy's CPU)."""

    def __init__(self, reactor: Any, connect_timeout: float) -> None:
        self._standard = _StandardEndpointFactory(
            reactor, BrowserLikePolicyForHTTPS(), connect_timeout, None
        )
        self._cache: dict[tuple[bytes, bytes, int], Any] = {}

    def endpointForURI(self, uri: Any) -> Any:
        key = (uri.scheme, uri.host, uri.port)
        endpoint = self._cache.get(key)
        if endpoint is None:
            endpoint = self._cache[key] = self._standard.endpointForURI(uri)
        return endpoint


def _cancelled(failure: Failure) -> bool:
    """A request failure that is our own cancellation, however the Agent wrapped it."""
    if failure.check(defer.CancelledError, ierror.ConnectingCancelledError):
        return True
    reasons = getattr(failure.value, "reasons", None) or []
    return any(
        isinstance(r, Failure) and r.check(defer.CancelledError, ierror.ConnectingCancelledError)
        for r in reasons
    )


class _ConnHeadersProtocol(HTTP11ClientProtocol):
    """Keeps the response's connection headers on it: Twisted files `Connection` apart from
    `response.headers`, and RFC 9110 wants the headers it names dropped too."""

    def request(self, request: Any) -> Deferred:
        d = super().request(request)
        parser = getattr(self, "_parser", None)
        if parser is not None:

            def keep(response: Any) -> Any:
                response.connection_headers = parser.connHeaders
                return response

            d.addCallback(keep)
        return d


class _QuietFactory(_HTTP11ClientFactory):
    # One "Starting factory" log line per upstream connection is noise, not news.
    noisy = False

    def buildProtocol(self, addr: Any) -> HTTP11ClientProtocol:
        return _ConnHeadersProtocol(self._quiescentCallback)


class _TrackingPool(HTTPConnectionPool):
    """Remembers whether the last connection handed out was a cached (reused) one.

    Agent.request asks the pool synchronously, so reading `last_reused` right after the call
    tells which kind of connection that request got.
    """

    last_reused = False
    _factory = _QuietFactory

    def getConnection(self, key: Any, endpoint: Any) -> Deferred:
        self.last_reused = any(c.state == "QUIESCENT" for c in self._connections.get(key, ()))
        return super().getConnection(key, endpoint)


@implementer(IBodyProducer)
class BytesProducer:
    """A body already in memory (bounded by max_body), written in one go."""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self.length = len(body)

    def startProducing(self, consumer: Any) -> Deferred:
        consumer.write(self._body)
        return defer.succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


class Upstream:
    """Sends requests to hosts over a persistent HTTP/1.1 pool (a fresh one for retries)."""

    def __init__(
        self, reactor: Any, connect_timeout: float, idle_timeout: float, per_host: int = 64
    ) -> None:
        self._reactor = reactor
        self.idle_timeout = idle_timeout
        self.pool = _TrackingPool(reactor, persistent=True)
        self.pool.maxPersistentPerHost = per_host
        self.pool.retryAutomatically = False  # crossbar decides about retries itself
        self._fresh_pool = HTTPConnectionPool(reactor, persistent=False)
        self._fresh_pool._factory = _QuietFactory
        self.set_connect_timeout(connect_timeout)

    def set_connect_timeout(self, seconds: float) -> None:
        """(Re)build the agents over the same pools: a reload keeps pooled connections."""
        endpoints = _CachedEndpoints(self._reactor, seconds)
        self._agent = Agent.usingEndpointFactory(self._reactor, endpoints, pool=self.pool)
        self._fresh = Agent.usingEndpointFactory(self._reactor, endpoints, pool=self._fresh_pool)

    async def send(
        self, method: bytes, url: bytes, headers: Headers, body: bytes | None, fresh: bool = False
    ) -> IResponse:
        """Send one request; raise UpstreamFailure when no response byte came back."""
        agent = self._fresh if fresh else self._agent
        producer = BytesProducer(body) if body is not None else None
        d = agent.request(method, url, headers, producer)
        reused = not fresh and self.pool.last_reused
        timed_out: list[bool] = []

        def on_timeout(result: Any, timeout: float) -> Any:
            timed_out.append(True)
            return result

        d.addTimeout(self.idle_timeout, self._reactor, onTimeoutCancel=on_timeout)
        try:
            return await d
        except defer.CancelledError:
            raise
        except Exception:
            if timed_out:  # the Agent reports our cancel as ResponseNeverReceived
                raise UpstreamFailure("idle timeout", host_fault=False) from None
            failure = Failure()
            if _cancelled(failure):
                # The client went away and its request was cancelled: not the host's fault.
                raise defer.CancelledError() from None
            mapped = classify(failure, reused)
            if mapped is None:
                raise
            raise mapped from None

    async def close(self) -> None:
        await self.pool.closeCachedConnections()
        await self._fresh_pool.closeCachedConnections()


@implementer(IPushProducer)
class Relay(Protocol):
    """Streams a response body to the client as it arrives, with back-pressure.

    The relay is the client request's streaming producer and passes pause/resume on to the
    upstream transport, so a client that stops reading pauses the upstream read; the idle timer
    stops meanwhile (the host is not silent, the client is slow). `done` fires with the reason
    the body ended (ResponseDone, PotentialDataLoss or an error); cancelling it aborts upstream.
    """

    def __init__(self, request: Any, clock: IReactorTime, idle_timeout: float, on_data) -> None:
        self._request = request
        self._clock = clock
        self._idle_timeout = idle_timeout
        self._on_data = on_data
        self._timer: IDelayedCall | None = None
        self.timed_out = False
        self.reason: Failure | None = None  # why the body ended, once `done` fired
        self.done: Deferred[None] = Deferred(canceller=self._cancel)

    def connectionMade(self) -> None:
        self._request.registerProducer(self, True)
        self._arm()

    def pauseProducing(self) -> None:
        self._disarm()
        self.transport.pauseProducing()

    def resumeProducing(self) -> None:
        self._arm()
        self.transport.resumeProducing()

    def stopProducing(self) -> None:
        self._disarm()
        self.transport.stopProducing()

    def dataReceived(self, data: bytes) -> None:
        self._arm()
        self._on_data(data)
        self._request.write(data)

    def connectionLost(self, reason: Failure = client.ResponseDone) -> None:
        self._disarm()
        if self._request.channel is not None:  # None once the client connection is gone
            self._request.unregisterProducer()
        self.reason = reason
        if not self.done.called:
            self.done.callback(None)

    def complete(self) -> bool:
        """True when the body ended as the host meant it to."""
        reason = self.reason
        return (
            not self.timed_out
            and reason is not None
            and reason.check(ResponseDone, PotentialDataLoss) is not None
        )

    def _arm(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.reset(self._idle_timeout)
        else:
            self._timer = self._clock.callLater(self._idle_timeout, self._idle)

    def _disarm(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _idle(self) -> None:
        self.timed_out = True
        self.transport.stopProducing()

    def _cancel(self, _: Deferred) -> None:
        self.stopProducing()
