"""The client-facing Resource: route, lease, slot, forward, stream back (SPEC §4)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from attrs import define
from twisted.internet.defer import CancelledError, Deferred, DeferredList
from twisted.internet.defer import TimeoutError as GraceOver
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from crossbar.accounting import Meter
from crossbar.app import App
from crossbar.errors import ClientError, error_body, not_found, unavailable
from crossbar.fingerprint import fingerprint
from crossbar.forward import Relay, UpstreamFailure, hop_by_hop
from crossbar.lease import Key, NoHost, PinnedDown
from crossbar.limiter import QueueFull, QueueTimeout
from crossbar.records import UsageRow
from crossbar.routing import Kind, check_key, choose_model, kind_of, parse_body, split_route

log = Logger(namespace="crossbar.proxy")
_INTERNAL = ClientError(500, "api_error", "crossbar failed on this request; try again")
_DROP_REQUEST = frozenset({b"host", b"content-length", b"authorization", b"accept-encoding"})


@define
class Exchange:
    """What one request did, collected as it goes, for its usage row and log line."""

    started: float
    route: str = ""
    fp: str = ""
    model: str = ""
    host: str = ""
    path: str = ""
    status: int = 0
    stream: bool = False
    queue_ms: float = 0.0
    ttfb_ms: float | None = None
    lease: str = ""
    error: str = ""
    meter: Meter | None = None


def _noop() -> None:
    pass


class ProxyResource(Resource):
    """Every client path; one coroutine per request, cancelled when the client goes away."""

    isLeaf = True

    def __init__(self, app: App) -> None:
        super().__init__()
        self.app = app
        self.active: set[Any] = set()

    def render(self, request: Any) -> Any:
        ex = Exchange(started=self.app.clock.seconds())
        d = Deferred.fromCoroutine(self._serve(request, ex))
        self.active.add(request)
        finished = request.notifyFinish()
        finished.addErrback(lambda _: d.cancel())
        finished.addBoth(lambda _: self.active.discard(request))
        d.addErrback(self._crashed, request, ex)
        return NOT_DONE_YET

    async def drain(self, grace: float) -> int:
        """Wait up to `grace` seconds for running requests to finish; abort the rest.

        Returns how many were aborted."""
        waiting = [r.notifyFinish() for r in list(self.active)]
        if waiting:
            all_done = DeferredList(waiting, consumeErrors=True)
            all_done.addTimeout(grace, self.app.clock)
            try:
                await all_done
            except GraceOver:
                pass
        left = list(self.active)
        for request in left:
            request.channel.transport.abortConnection()
        return len(left)

    async def _serve(self, request: Any, ex: Exchange) -> None:
        try:
            await self._dispatch(request, ex)
        except ClientError as e:
            ex.status, ex.error = e.status, ex.error or e.message
            self._answer_error(request, e)
        except CancelledError:
            ex.status = ex.status or 499
            ex.error = ex.error or "client disconnected"
        except Exception:
            log.failure("request failed inside crossbar")
            ex.status, ex.error = 500, "internal error"
            self._answer_error(request, _INTERNAL)
        finally:
            if ex.route:
                self._account(ex)

    def _crashed(self, failure: Failure, request: Any, ex: Exchange) -> None:
        # Last resort: _serve handles its own errors, so only a bug in that handling gets here.
        log.failure("request failed inside crossbar", failure)
        self._answer_error(request, _INTERNAL)

    def _answer_error(self, request: Any, error: ClientError) -> None:
        if request.finished or request._disconnected:
            return
        if request.startedWriting:
            request.channel.transport.loseConnection()
            return
        request.setResponseCode(error.status)
        request.responseHeaders.setRawHeaders(b"content-type", [b"application/json"])
        for name, value in error.headers.items():
            request.responseHeaders.setRawHeaders(name.encode(), [value.encode()])
        request.write(error.body())
        request.finish()

    async def _dispatch(self, request: Any, ex: Exchange) -> None:
        config = self.app.config
        method = request.method.decode("ascii", "replace")
        raw_path = request.path.decode("utf-8", "replace")
        query = urlsplit(request.uri.decode("utf-8", "replace")).query
        header = _header_reader(request)
        target = split_route(config, raw_path, query, header("X-Crossbar-Route"))
        route = target.route
        ex.route, ex.path = route.name, target.path
        check_key(route, header("Authorization"))
        kind = kind_of(method, target.path)
        if kind is None:
            raise not_found(f"crossbar does not serve {method} {target.path}")
        if kind is Kind.MODELS:
            return self._answer_json(request, 200, _models(config.models_of(route)))
        if kind is Kind.HEALTH:
            return self._answer_health(request, route)
        raw = request.content.read()
        body = parse_body(kind, method, target.path, raw)
        ex.model = model = choose_model(config, route, body, query)
        candidates = config.hosts_for(route, model)
        ex.fp = fingerprint(header, body, target.path, config.server.fingerprint_chars)
        key = Key(route.name, "" if route.per_route() else ex.fp, model)
        await self._forward(request, ex, kind, key, candidates, body, raw, method, target)

    async def _forward(self, request, ex, kind, key, candidates, body, raw, method, target):
        app = self.app
        route = target.route
        failed: tuple[str, UpstreamFailure] | None = None  # the host that just failed, and how
        while True:
            try:
                acquired = await app.table.acquire(key, candidates, app.clock.seconds())
            except PinnedDown as e:
                raise unavailable(
                    f"route {route.name!r} is pinned to host {e.host!r}, which is down; "
                    "ask the operator to unpin or wait for it",
                    retry_after=app.config.server.health_interval,
                ) from None
            except NoHost:
                if failed is not None:  # the host that failed was the last one left
                    ex.error = f"upstream {failed[1].reason}"
                    raise failed[1].client_error(failed[0]) from None
                raise unavailable(
                    f"no healthy host can take model {key.model!r} on route {route.name!r} now",
                    retry_after=app.config.server.health_interval,
                ) from None
            ex.host = host = acquired.host
            ex.lease = "pinned" if acquired.pinned else "reused" if acquired.reused else "new"
            release = await self._slot(kind, route, host, key.model, ex)
            try:
                response = await self._send(request, host, key.model, body, raw, method, target)
            except UpstreamFailure as failure:
                release()
                if failure.host_fault:
                    app.hosts.passive_failure(host, failure.reason)
                    if kind is Kind.INFERENCE and failed is None:
                        failed = (host, failure)  # the lease moves (unhealthy) on this acquire
                        continue
                ex.error = f"upstream {failure.reason}"
                raise failure.client_error(host) from None
            except BaseException:
                release()
                raise
            try:
                await self._relay(request, ex, response)
            finally:
                release()
            return

    async def _slot(self, kind, route, host, model, ex) -> Any:
        limiter = self.app.limiter
        if kind is not Kind.INFERENCE:
            return _noop
        if not route.queues():
            return limiter.track(host, model)
        waited = self.app.clock.seconds()
        try:
            return await limiter.acquire(host, model)
        except QueueFull as e:
            raise ClientError(
                429,
                "rate_limit_error",
                f"host {host} has {limiter.queued(host, model)} requests waiting for "
                f"{model!r}; retry later",
                headers={"Retry-After": str(max(1, round(e.retry_after)))},
            ) from None
        except QueueTimeout as e:
            raise unavailable(
                f"waited too long for a free slot on host {host}; retry later", e.retry_after
            ) from None
        finally:
            ex.queue_ms += (self.app.clock.seconds() - waited) * 1000

    async def _send(self, request, host, model, body, raw, method, target) -> Any:
        app = self.app
        hosts = app.config.hosts
        host_config = hosts[host]
        upstream_model = host_config.model(model)
        if isinstance(body, dict) and upstream_model is not None:
            name = upstream_model.upstream_name
            if body.get("model", name) != name or (upstream_model.upstream and "model" not in body):
                body = {**body, "model": name}
                raw = json.dumps(body).encode()
        url = host_config.url + target.path + (f"?{target.query}" if target.query else "")
        headers = _upstream_headers(request, host_config.api_key)
        payload = raw if (raw or method == "POST") else None
        try:
            return await app.upstream.send(method.encode(), url.encode(), headers, payload)
        except UpstreamFailure as failure:
            if not failure.reused:
                raise
        # A pooled connection died under us: a keep-alive race, not the host. Once, fresh.
        return await app.upstream.send(method.encode(), url.encode(), headers, payload, fresh=True)

    async def _relay(self, request: Any, ex: Exchange, response: Any) -> None:
        app = self.app
        ex.status = response.code
        request.setResponseCode(response.code, response.phrase)
        drop = hop_by_hop(response.headers)
        for name, values in response.headers.getAllRawHeaders():
            if name.lower() not in drop:
                request.responseHeaders.setRawHeaders(name, values)
        ctype = (response.headers.getRawHeaders(b"content-type") or [b""])[0]
        ex.stream = ctype.lower().startswith(b"text/event-stream")
        for name, value in (
            (b"X-Crossbar-Host", ex.host),
            (b"X-Crossbar-Lease", ex.lease),
            (b"X-Crossbar-Queue-Ms", str(round(ex.queue_ms))),
        ):
            request.responseHeaders.setRawHeaders(name, [value.encode()])
        meter = ex.meter = Meter(stream=ex.stream)

        def on_data(data: bytes) -> None:
            if ex.ttfb_ms is None:
                ex.ttfb_ms = (app.clock.seconds() - ex.started) * 1000
            meter.feed(data)

        relay = Relay(request, app.clock, app.config.server.upstream_idle_timeout, on_data)
        response.deliverBody(relay)
        await relay.done
        if relay.complete():
            meter.finish()
            request.finish()
            return
        meter.delivered()
        ex.error = "upstream idle timeout" if relay.timed_out else "upstream closed mid-response"
        if ex.stream:
            # One error event, then abort without the terminating chunk: the client can tell
            # the stream was cut. No [DONE] is ever invented.
            event = json.loads(error_body(502, "api_error", f"host {ex.host}: {ex.error}"))
            request.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        request.channel.transport.loseConnection()

    def _answer_json(self, request: Any, status: int, obj: Any) -> None:
        request.setResponseCode(status)
        request.responseHeaders.setRawHeaders(b"content-type", [b"application/json"])
        request.write(json.dumps(obj).encode())
        request.finish()

    def _answer_health(self, request: Any, route: Any) -> None:
        healthy = [h for h in route.hosts if self.app.hosts.healthy(h)]
        if not healthy:
            raise unavailable(f"no host of route {route.name!r} is healthy", retry_after=5)
        self._answer_json(request, 200, {"status": "ok", "healthy_hosts": healthy})

    def _account(self, ex: Exchange) -> None:
        now = self.app.clock.seconds()
        tokens = ex.meter.tokens if ex.meter is not None else None
        row = UsageRow(
            at=now,
            route=ex.route,
            fp=ex.fp,
            model=ex.model,
            host=ex.host,
            path=ex.path,
            status=ex.status,
            stream=ex.stream,
            prompt_tokens=tokens.prompt if tokens else 0,
            cached_tokens=tokens.cached if tokens else 0,
            completion_tokens=tokens.completion if tokens else 0,
            queue_ms=round(ex.queue_ms, 3),
            ttfb_ms=round(ex.ttfb_ms, 3) if ex.ttfb_ms is not None else None,
            duration_ms=round((now - ex.started) * 1000, 3),
            lease=ex.lease,
            error=ex.error,
        )
        self.app.record(row)
        if ex.meter is not None and ex.meter.ids and self.app.ids is not None:
            self.app.ids.remember(ex.meter.ids, ex.host, ex.fp, now)


def _header_reader(request: Any):
    def header(name: str) -> str | None:
        value = request.getHeader(name)
        return value.decode("latin-1") if isinstance(value, bytes) else value

    return header


def _upstream_headers(request: Any, api_key: str) -> Headers:
    """The client's headers minus hop-by-hop ones and its credentials, plus X-Forwarded-*."""
    incoming = request.requestHeaders
    drop = hop_by_hop(incoming) | _DROP_REQUEST
    out = Headers()
    for name, values in incoming.getAllRawHeaders():
        if name.lower() not in drop:
            out.setRawHeaders(name, values)
    client = request.getClientAddress()
    peer = getattr(client, "host", "")
    prior = b", ".join(incoming.getRawHeaders(b"x-forwarded-for", []))
    out.setRawHeaders(b"x-forwarded-for", [(prior + b", " if prior else b"") + peer.encode()])
    out.setRawHeaders(b"x-forwarded-proto", [b"https" if request.isSecure() else b"http"])
    host = incoming.getRawHeaders(b"host")
    if host:
        out.setRawHeaders(b"x-forwarded-host", [host[0]])
    if api_key:
        out.setRawHeaders(b"authorization", [b"Bearer " + api_key.encode()])
    return out


def _models(models: list[str]) -> dict[str, Any]:
    data = [{"id": m, "object": "model", "created": 0, "owned_by": "crossbar"} for m in models]
    return {"object": "list", "data": data}
