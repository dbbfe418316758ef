"""All the host sees: the request crossbar sends it, the connection it goes over, and what a
failure to get an answer means.

Requests go over a persistent HTTP/1.1 pool. One retry rule (Go's net/http's): a request is
sent again, once, on a fresh connection, only when no byte of it reached the host (its
connect failed for nothing the host did), or when it may be repeated: an idempotent method
(GET, HEAD, OPTIONS, TRACE, PUT, DELETE) or an `Idempotency-Key` the client set, and its
pooled connection closed before any byte of answer (the host closed it as we reused it). A
completion is neither: a host that read one and closed gets it once, and the client a 502.
Cancelling a send (the client left) is never reported as a host failure,
whatever exception Twisted raises for it: the send's own canceller sets a flag, and a failure
that follows it is a cancellation.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode

from attrs import frozen
from twisted.internet import error as ierror
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.iweb import IAgentEndpointFactory

from crossbar.config import Config, HostConfig, ModelConfig
from crossbar.wire.answer import HostClosed, HostResponse, NotHTTP, read_body
from crossbar.wire.dialects import Dialect
from crossbar.wire.endpoints import HostEndpoints, authorization
from crossbar.wire.pool import (
    ConnectionsBusy,
    HostConnection,
    HostPool,
    PoolCounts,
    request_head,
)
from crossbar.wire.reported import count

if TYPE_CHECKING:  # inbound's errors map upstream failures: no import at run time
    from crossbar.wire.inbound import Inbound

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
# Never forwarded upstream: recomputed (Host, Content-Length), the client's own credentials
# (the host's api_key replaces them; x-api-key is how Anthropic's SDKs send theirs),
# Accept-Encoding so the body stays readable for usage, Proxy (httpoxy: a CGI-style host
# would take it for its HTTP_PROXY), Expect (crossbar has the whole body when it sends) and
# the X-Forwarded-* crossbar writes itself.
_DROP_REQUEST = frozenset(
    {
        b"host",
        b"content-length",
        b"authorization",
        b"x-api-key",
        b"accept-encoding",
        b"proxy",
        b"expect",
        b"x-forwarded-for",
        b"x-forwarded-proto",
    }
)


def hop_by_hop(headers: Any, connection: Any = None) -> frozenset[bytes]:
    """The header names not to forward: the fixed set, `Proxy-*`, and those Connection names
    (read from `connection` where the client library files them apart). `headers`: anything
    with twisted.web's `getRawHeaders` and `getAllRawHeaders` (Headers, RawHeaders)."""
    tokens = (connection or headers).getRawHeaders(b"connection")
    proxy = [n.lower() for n, _ in headers.getAllRawHeaders() if n[:6].lower() == b"proxy-"]
    if not tokens and not proxy:
        return HOP_BY_HOP
    names = set(HOP_BY_HOP)
    for value in tokens or ():
        names.update(t.strip().lower() for t in value.split(b",") if t.strip())
    names.update(proxy)
    return frozenset(names)


Pairs = list[tuple[bytes, bytes]]


@frozen
class Outgoing:
    """One request as the host gets it: its header fields as (name, value) pairs."""

    method: bytes
    url: bytes
    headers: Pairs
    body: bytes | None


def renamed_body(body: Any, model: ModelConfig | None) -> Any:
    """The body with `model` named the host's way (its `upstream` name), or `body` itself
    when nothing changes."""
    if not isinstance(body, dict) or model is None:
        return body
    name = model.upstream_name
    if body.get("model", name) != name or (model.upstream and "model" not in body):
        return {**body, "model": name}
    return body


def renamed_query(query: str, model: ModelConfig | None) -> str:
    """`?model=` names the model the host's way too, like the body's "model"."""
    if not query or model is None or "model=" not in query:
        return query
    pairs = parse_qsl(query, keep_blank_values=True)
    if all(v == model.upstream_name for k, v in pairs if k == "model"):
        return query  # already the host's name (an alias or upstream name is renamed)
    return urlencode([(k, model.upstream_name if k == "model" else v) for k, v in pairs])


def forwarded_headers(inbound: Inbound, api_key: str) -> Pairs:
    """The client's headers minus hop-by-hop ones and its credentials, plus X-Forwarded-*
    and the host's api key."""
    incoming = inbound.headers
    fields = list(incoming.getAllRawHeaders())
    tokens = incoming.getRawHeaders(b"connection")
    host = incoming.getRawHeaders(b"host")
    hops: frozenset[bytes] | set[bytes] = HOP_BY_HOP
    if tokens:
        hops = set(HOP_BY_HOP)
        for value in tokens:
            hops.update(t.strip().lower() for t in value.split(b",") if t.strip())
    out = []
    for name, values in fields:
        low = name.lower()
        if (
            low in _DROP_REQUEST
            or low in hops
            or low[:6] == b"proxy-"
            or (host and low == b"x-forwarded-host")
        ):
            continue
        for value in values:
            out.append((name, value))
    prior = b", ".join(incoming.getRawHeaders(b"x-forwarded-for", []))
    peer = inbound.peer.encode()
    out.append((b"X-Forwarded-For", (prior + b", " if prior else b"") + peer))
    out.append((b"X-Forwarded-Proto", b"https" if inbound.secure else b"http"))
    if host:
        out.append((b"X-Forwarded-Host", host[0]))
    if api_key:
        out.append((b"Authorization", b"Bearer " + api_key.encode()))
    return out


def prepare(host: HostConfig, m: ModelConfig | None, inbound: Inbound) -> Outgoing:
    """The request `host` gets for a client's `inbound` request for model `m` (as the host
    serves it now). A router-mode host is told the model of a GET too (`?model=`): without
    it, `/slots` and `/metrics` are refused and `/props` describes the router itself."""
    body = renamed_body(inbound.body, m)
    raw = inbound.raw if body is inbound.body else json.dumps(body).encode()
    query = renamed_query(inbound.query, m)
    if host.discover and m is not None and inbound.method == "GET" and "model=" not in query:
        query = "&".join(q for q in (query, urlencode({"model": m.upstream_name})) if q)
    url = (host.url + inbound.path + (f"?{query}" if query else "")).encode()
    payload = raw if (raw or inbound.method == "POST") else None
    return Outgoing(inbound.method.encode(), url, forwarded_headers(inbound, host.api_key), payload)


_IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})
# The headers by which a client says a request may be repeated (and names it).
IDEMPOTENCY_HEADERS = (b"idempotency-key", b"x-idempotency-key")


def repeatable(out: Outgoing) -> bool:
    """Whether `out` may reach its host twice: an idempotent method (RFC 9110 §9.2.2), or an
    `Idempotency-Key` (or `X-Idempotency-Key`) the client set, as Go's net/http reads it."""
    if out.method in _IDEMPOTENT:
        return True
    return any(name.lower() in IDEMPOTENCY_HEADERS for name, _ in out.headers)


CONNECTIONS_BUSY = "connections busy"  # crossbar's own bound on a host's connections


@frozen
class UpstreamFailure(Exception):
    """No usable answer came from the host; nothing of it reached the client.

    `connecting`: the request never reached the host (refused, connect timeout, no route):
    the host looks down, and the request may go to another host. Anything later (a reset or
    close while the host had the request, an answer that is not HTTP) is this request's
    failure alone: a request that crashes hosts must not eject the fleet; the probes judge
    the host. `reused`: it happened on a pooled connection, which may be a keep-alive race,
    retried once on a fresh connection to the same host when the request may be repeated
    (`repeatable`). `detail` says what was not HTTP.
    `blameless`: it never reached the host, and not for anything the host did: this process
    ran out of file descriptors or ports, or its reactor was stalled (frozen, starved) past the
    connect timeout, so the timeout fired late. Such a failure says nothing of the host: it
    never ejects one, nor moves a conversation. `connections busy` is crossbar's own bound
    (`upstream_max_connections`): never retried, never the host's fault (`connecting` False).
    """

    # refused, connect timeout, connect failed, reset, not http, idle timeout, connections busy
    reason: str
    connecting: bool
    reused: bool = False
    detail: str = ""
    blameless: bool = False


# A connect that fails with one of these ran out of this process's or machine's resources.
_OWN_FAULTS = {errno.EMFILE, errno.ENFILE, errno.EADDRNOTAVAIL, errno.ENOBUFS, errno.ENOMEM}
# A connect timeout that fired this much later than due was the reactor's lateness.
_LATE = 1.0


def classify(failure: Failure, reused: bool, late: bool = False) -> UpstreamFailure | None:
    """Map a request failure to an UpstreamFailure, or None when it is something else.
    `late`: the request took longer than its connect timeout and this much more."""
    if failure.check(ierror.ConnectionRefusedError):
        return UpstreamFailure("refused", connecting=True)
    if failure.check(ierror.TimeoutError):
        return UpstreamFailure("connect timeout", connecting=True, blameless=late)
    if failure.check(ierror.ConnectError) and _own_fault(failure.value):
        return UpstreamFailure(
            "no local resources", connecting=True, detail=str(failure.value), blameless=True
        )
    if failure.check(ierror.ConnectError, ierror.DNSLookupError):
        return UpstreamFailure("connect failed", connecting=True)
    if failure.check(NotHTTP):
        return UpstreamFailure("not http", connecting=False, detail=failure.value.detail)
    if failure.check(HostClosed):
        # No response (or only part of its head) arrived: to the client, nothing was sent yet.
        return UpstreamFailure("reset", connecting=False, reused=reused)
    if failure.check(ConnectionsBusy):
        # Not the host's doing, and another try would only wait again.
        return UpstreamFailure(CONNECTIONS_BUSY, connecting=False, detail=str(failure.value))
    return None


def _own_fault(error: BaseException) -> bool:
    number = getattr(error, "osError", None)
    if isinstance(number, BaseException):
        number = getattr(number, "errno", None)
    return number in _OWN_FAULTS


class _Discard(Protocol):
    """Reads nothing: aborts a response nobody waits for any more."""

    def connectionMade(self) -> None:
        self.transport.stopProducing()


class Upstream:
    """Sends requests to hosts over kept connections (wire/pool.py), and fresh ones for the
    one retry."""

    def __init__(
        self,
        reactor: Any,
        connect_timeout: float,
        idle_timeout: float,
        endpoints: IAgentEndpointFactory | None = None,
        per_host: int = 64,
        max_connections: int = 256,
        connect_wait: float = 10.0,
    ) -> None:
        """`endpoints` replaces TCP in tests (one made from `connect_timeout` otherwise);
        `max_connections` per host, a request beyond waiting `connect_wait` at most for one."""
        self._reactor = reactor
        self.idle_timeout = idle_timeout  # no byte from the host this long: give up
        self._connect_timeout = connect_timeout
        self._own_endpoints = endpoints is None
        self._pool = HostPool(
            reactor,
            endpoints or HostEndpoints(reactor, connect_timeout),
            per_host,
            max_connections=max_connections,
            connect_wait=connect_wait,
        )

    def reconfigure(self, config: Config) -> None:
        """Take new timeouts and bounds; pooled connections stay."""
        s = config.server
        self.idle_timeout = s.upstream_idle_timeout
        self._pool.reconfigure(s.upstream_max_connections, s.upstream_connect_queue_timeout)
        if self._own_endpoints and s.upstream_connect_timeout != self._connect_timeout:
            self._connect_timeout = s.upstream_connect_timeout
            self._pool.endpoints = HostEndpoints(self._reactor, s.upstream_connect_timeout)

    async def send(self, out: Outgoing, on_done: Callable[[], None] | None = None) -> HostResponse:
        """Send `out`; raise UpstreamFailure when no response byte came back, CancelledError
        when the caller cancelled. `on_done` is called as soon as the host's answer has all
        been read (the host is free), before its last bytes are relayed."""
        try:
            return await self._attempt(out, fresh=False, on_done=on_done)
        except UpstreamFailure as failure:
            if not (failure.blameless or (failure.reused and repeatable(out))):
                raise
        # The connect failed for nothing the host did (our reactor was late, our descriptors
        # ran out), or a pooled connection died under a request that may be repeated (a
        # keep-alive race): once more, fresh.
        return await self._attempt(out, fresh=True, on_done=on_done)

    def _attempt(
        self, out: Outgoing, fresh: bool, on_done: Callable[[], None] | None = None
    ) -> Deferred[HostResponse]:
        pool = self._pool
        origin, target = pool.origin(out.url)
        # A distrusted host's connection closes after its answer: it says so too.
        head = request_head(
            out.method, target, origin.host, out.headers, out.body, origin.distrusted
        )
        connection = None if fresh else pool.take(origin)
        request = (head, out.body, out.method == b"HEAD", on_done)
        return _Attempt(self, origin, connection, request, fresh).done

    async def post_json(
        self, host: HostConfig, path: str, payload: Any, extra: Sequence[tuple[bytes, bytes]] = ()
    ) -> tuple[int, bytes]:
        """crossbar's own call to a host (a token count, a prewarm): `payload` POSTed as JSON
        with the host's authorization (and `extra` headers: a trace context), the whole
        answer read. Raises UpstreamFailure when no answer came."""
        headers = [(b"Content-Type", b"application/json")]
        headers += [(k.encode(), v.encode()) for k, v in authorization(host).items()]
        headers += extra
        out = Outgoing(b"POST", (host.url + path).encode(), headers, json.dumps(payload).encode())
        response = await self.send(out)
        return response.code, await read_body(response)

    async def count_tokens(self, host: HostConfig, dialect: Dialect, body: Any) -> int | None:
        """Ask `host` how many tokens the prompt of `body` is; None when it cannot say."""
        if not isinstance(body, dict):
            return None
        found = dialect.count_request(body)
        if found is None:
            return None
        path, payload = found
        if host.discover:
            # A router loads a model a count names: counting must not load what the turn, once
            # admitted, may have to wait for (the swap gate). An unloaded model is not counted.
            path += "?autoload=false"
        try:
            status, raw = await self.post_json(host, path, payload)
            data = json.loads(raw)
        except CancelledError:
            raise  # the client left: stop here, never go on to send the request
        except Exception:
            return None  # the host will refuse an oversized prompt itself
        if status != 200 or not isinstance(data, dict):
            return None
        if "input_tokens" in data:
            return count(data["input_tokens"])  # none past wire/reported.py's bound
        tokens = data.get("tokens")
        return len(tokens) if isinstance(tokens, list) else None

    def counts(self, url: str) -> PoolCounts:
        """What the pool knows of the connections to the host at `url` (the metrics')."""
        return self._pool.counts(url)

    async def close(self) -> None:
        """Close every pooled connection."""
        self._pool.close()


class _Attempt:
    """One try at a request: connect (unless a kept connection is given), write, wait for the
    answer's head. `done` fires with the answer, or fails with an UpstreamFailure (or what no
    failure kind names); cancelling it (the client left) is a CancelledError, whatever the
    connect or the connection says of it."""

    def __init__(
        self,
        upstream: Upstream,
        origin: Any,
        connection: HostConnection | None,
        request: tuple[bytes, bytes | None, bool, Callable[[], None] | None],
        fresh: bool = False,
    ) -> None:
        """`request`: its head, body, whether it is a HEAD, and its `on_done`; `fresh`: on a
        new connection only (the retry), never a kept one."""
        clock = upstream._reactor
        self._clock = clock
        self._connect_timeout = upstream._connect_timeout
        self._started = clock.seconds()
        self._reused = False  # on a kept connection (one that may race its host's close)
        self._request = request
        self._why = ""  # who stopped it: "client" (our caller) or "idle"
        self.done: Deferred[HostResponse] = Deferred(self._cancel)
        self._timer = clock.callLater(upstream.idle_timeout, self._stop, "idle")
        if connection is None:
            # A new one, or at the host's bound the first to come free (kept, unless fresh).
            self._waiting: Deferred[Any] = upstream._pool.connect(origin, fresh, self._opening)
            self._waiting.addCallbacks(self._send, self._failed)
        else:
            self._send(connection)

    def _opening(self) -> None:
        # Its connect begins (at once, or after a wait at the host's bound): a connect timeout
        # that fires late is judged from here.
        self._started = self._clock.seconds()

    def _send(self, connection: HostConnection) -> None:
        if self._why:  # stopped while it connected: the connection is not wanted
            connection.abort()
            return
        self._reused = connection.kept
        self._waiting = connection.request(*self._request)
        self._waiting.addCallbacks(self._answered, self._failed)

    def _answered(self, response: HostResponse) -> None:
        if self._timer.active():
            self._timer.cancel()
        if self.done.called:  # cancelled meanwhile: nobody takes this answer
            response.deliverBody(_Discard())
        else:
            self.done.callback(response)

    def _failed(self, failure: Failure) -> None:
        if self._timer.active():
            self._timer.cancel()
        if self._why == "client" or self.done.called:
            return  # `done` fails with CancelledError itself
        if self._why == "idle":
            # Never retried: a silent host is not a keep-alive race, and resending doubles
            # its work.
            self.done.errback(UpstreamFailure("idle timeout", connecting=False))
            return
        late = self._clock.seconds() - self._started > self._connect_timeout + _LATE
        mapped = classify(failure, self._reused, late)
        self.done.errback(failure if mapped is None else mapped)

    def _stop(self, why: str) -> None:
        if not self._why:
            self._why = why
            self._waiting.cancel()

    def _cancel(self, done: Deferred[HostResponse]) -> None:
        if self._timer.active():
            self._timer.cancel()
        self._stop("client")
