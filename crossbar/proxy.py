"""The client-facing Resource: route, lease, slot, forward, stream back (SPEC §4)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from attrs import frozen
from twisted.internet.defer import CancelledError, Deferred, DeferredList
from twisted.internet.defer import TimeoutError as GraceOver
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from crossbar.app import App
from crossbar.errors import ClientError, not_found, unavailable
from crossbar.fingerprint import fingerprint
from crossbar.forward import UpstreamFailure
from crossbar.guard import prompt_chars
from crossbar.lease import Acquired, Key, NoHost, PinnedDown
from crossbar.limiter import QueueFull, QueueTimeout
from crossbar.records import UsageRow
from crossbar.respond import (
    Exchange,
    answer_error,
    answer_json,
    header_reader,
    models_list,
    relay,
    upstream_headers,
)
from crossbar.routing import Kind, Target, check_key, choose_model, kind_of, parse_body, split_route
from crossbar.sidecalls import exact_count, named_origin

log = Logger(namespace="crossbar.proxy")
_INTERNAL = ClientError(500, "api_error", "crossbar failed on this request; try again")


@frozen
class Call:
    """A parsed request on its way upstream."""

    request: Any
    kind: Kind
    method: str
    target: Target
    body: Any
    raw: bytes
    key: Key
    candidates: tuple[str, ...]
    origin_host: str | None  # the host of the completion the request names, if any


def _noop() -> None:
    pass


def _rewrite_model_query(query: str, model: Any) -> str:
    """`?model=` names the model the host's way too, like the body's "model"."""
    if not query or model is None or not model.upstream or "model=" not in query:
        return query
    pairs = parse_qsl(query, keep_blank_values=True)
    return urlencode([(k, model.upstream_name if k == "model" else v) for k, v in pairs])


class ProxyResource(Resource):
    """Every client path; one coroutine per request, cancelled when the client goes away."""

    isLeaf = True

    def __init__(self, app: App) -> None:
        super().__init__()
        self.app = app
        self.active: dict[Any, Deferred[None]] = {}  # request -> its handling, until accounted

    def render(self, request: Any) -> Any:
        ex = Exchange(started=self.app.clock.seconds())
        # Asked for before serving: a request answered at once never fires a later notice.
        finished = request.notifyFinish()
        d = Deferred.fromCoroutine(self._serve(request, ex))
        finished.addErrback(lambda _: d.cancel())
        d.addErrback(self._crashed, request)
        if not d.called:
            self.active[request] = d

            def settled(result: object) -> object:
                self.active.pop(request, None)
                return result

            d.addBoth(settled)
        return NOT_DONE_YET

    async def drain(self, grace: float) -> int:
        """Wait up to `grace` seconds for running requests to finish; abort the rest and wait
        for their usage rows. Returns how many were aborted."""
        if await self._settle(grace):
            return 0
        left = list(self.active)
        for request in left:
            if request.channel is not None:
                request.channel.transport.abortConnection()
        await self._settle(5.0)
        return len(left)

    async def _settle(self, seconds: float) -> bool:
        """True when every request in hand finished within `seconds`."""
        if not self.active:
            return True
        everything = DeferredList(list(self.active.values()), consumeErrors=True)
        everything.addTimeout(seconds, self.app.clock)
        try:
            await everything
        except GraceOver:
            return False
        return True

    async def _serve(self, request: Any, ex: Exchange) -> None:
        try:
            await self._dispatch(request, ex)
        except ClientError as e:
            ex.status, ex.error = e.status, ex.error or e.message
            answer_error(request, e)
        except CancelledError:
            ex.status = ex.status or 499
            ex.error = ex.error or "client disconnected"
        except Exception:
            log.failure("request failed inside crossbar")
            ex.status, ex.error = 500, "internal error"
            answer_error(request, _INTERNAL)
        finally:
            if ex.route:
                self._account(ex)

    def _crashed(self, failure: Failure, request: Any) -> None:
        # Last resort: _serve handles its own errors, so only a bug in that handling gets here.
        if failure.check(CancelledError):
            return
        log.failure("request failed inside crossbar", failure)
        answer_error(request, _INTERNAL)

    async def _dispatch(self, request: Any, ex: Exchange) -> None:
        app, config = self.app, self.app.config
        method = request.method.decode("ascii", "replace")
        query = urlsplit(request.uri.decode("utf-8", "replace")).query
        header = header_reader(request)
        target = split_route(
            config, request.path.decode("utf-8", "replace"), query, header("X-Crossbar-Route")
        )
        route = target.route
        ex.route, ex.path = route.name, target.path
        check_key(route, header("Authorization"), header("X-Api-Key"))
        kind = kind_of(method, target.path)
        if kind is None:
            raise not_found(f"crossbar does not serve {method} {target.path}")
        if kind is Kind.MODELS:
            return answer_json(request, 200, models_list(config.models_of(route)), ex)
        if kind is Kind.HEALTH:
            healthy = [h for h in route.hosts if app.hosts.healthy(h)]
            if not healthy:
                raise unavailable(f"no host of route {route.name!r} is healthy", retry_after=5)
            return answer_json(request, 200, {"status": "ok", "healthy_hosts": healthy}, ex)
        raw = request.content.read()
        body = parse_body(kind, method, target.path, raw)
        ex.model = model = choose_model(config, route, body, query)
        candidates = tuple(config.hosts_for(route, model))
        ex.fp = fingerprint(header, body, target.path, config.server.fingerprint_chars)
        ex.chars = prompt_chars(body) if kind is Kind.INFERENCE else 0
        origin = named_origin(app, target.path, body, app.clock.seconds())
        if origin is not None and origin.fp:
            ex.fp = origin.fp  # a Responses chain is the conversation of its first response
        key = Key(route.name, "" if route.per_route() else ex.fp, model)
        # A control call acts on one running completion: it goes where that completion runs,
        # pinned route or not. A Responses chain only takes its conversation's lease (so a pin
        # still wins, as it does for every turn of a conversation).
        origin_host = None
        if origin is not None and kind is Kind.CONTROL and origin.host in candidates:
            origin_host = origin.host
        call = Call(request, kind, method, target, body, raw, key, candidates, origin_host)
        await self._forward(call, ex)

    async def _place(self, call: Call, failed: tuple[str, UpstreamFailure] | None) -> Acquired:
        """The host for this call: a named completion's own host, else the lease's."""
        app = self.app
        if call.origin_host is not None and app.hosts.healthy(call.origin_host):
            pinned = app.table.pinned(call.key.route) is not None
            return Acquired(call.origin_host, reused=True, pinned=pinned)
        route = call.target.route
        try:
            return await app.table.acquire(call.key, call.candidates, app.clock.seconds())
        except PinnedDown as e:
            raise unavailable(
                f"route {route.name!r} is pinned to host {e.host!r}, which is down; "
                "ask the operator to unpin or wait for it",
                retry_after=app.config.server.health_interval,
            ) from None
        except NoHost:
            if failed is not None:  # the host that just failed was the last one left
                raise failed[1].client_error(failed[0]) from None
            raise unavailable(
                f"no healthy host can take model {call.key.model!r} on route {route.name!r} now",
                retry_after=app.config.server.health_interval,
            ) from None

    async def _forward(self, call: Call, ex: Exchange) -> None:
        app = self.app
        failed: tuple[str, UpstreamFailure] | None = None  # the host that just failed, and how
        removed_retries = 3
        while True:
            acquired = await self._place(call, failed)
            ex.host = host = acquired.host
            ex.lease = "pinned" if acquired.pinned else "reused" if acquired.reused else "new"
            if call.kind is Kind.INFERENCE:
                await self._guard(call, host)
            release = await self._slot(call, host, ex)
            if host not in app.config.hosts:  # a reload removed it while we waited
                release()
                if removed_retries := removed_retries - 1:
                    continue
                raise unavailable(f"host {host} was removed from the config; try again", 1)
            try:
                response = await self._send(call, host)
            except UpstreamFailure as failure:
                release()
                if failure.host_fault:
                    app.hosts.passive_failure(host, failure.reason)
                    if call.kind is Kind.INFERENCE and failed is None:
                        failed = (host, failure)  # the lease moves (unhealthy) on this acquire
                        continue
                ex.error = f"upstream {failure.reason}"
                raise failure.client_error(host) from None
            except BaseException:
                release()
                raise
            try:
                await relay(app, call.request, ex, response)
            finally:
                release()
            return

    async def _guard(self, call: Call, host: str) -> None:
        """SPEC §7: refuse what cannot fit in the host's slot before anything goes upstream."""
        app, model = self.app, call.key.model

        async def count() -> int | None:
            return await exact_count(app, host, call.target.path, self._body_for(call, host))

        await app.guard.check(model, host, app.hosts.ctx(host, model), call.body, count)

    async def _slot(self, call: Call, host: str, ex: Exchange) -> Any:
        limiter, model = self.app.limiter, call.key.model
        if call.kind is not Kind.INFERENCE:
            return _noop  # control calls take neither a slot nor a queue place
        if not call.target.route.queues():
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

    def _body_for(self, call: Call, host: str) -> Any:
        """The body as `host` gets it: `model` rewritten to the host's upstream name."""
        body = call.body
        model = self.app.config.hosts[host].model(call.key.model)
        if not isinstance(body, dict) or model is None:
            return body
        name = model.upstream_name
        if body.get("model", name) != name or (model.upstream and "model" not in body):
            return {**body, "model": name}
        return body

    async def _send(self, call: Call, host: str) -> Any:
        host_config = self.app.config.hosts[host]
        body = self._body_for(call, host)
        raw = call.raw if body is call.body else json.dumps(body).encode()
        query = _rewrite_model_query(call.target.query, host_config.model(call.key.model))
        url = (host_config.url + call.target.path + (f"?{query}" if query else "")).encode()
        headers = upstream_headers(call.request, host_config.api_key)
        payload = raw if (raw or call.method == "POST") else None
        method = call.method.encode()
        upstream = self.app.upstream
        try:
            return await upstream.send(method, url, headers, payload)
        except UpstreamFailure as failure:
            if not failure.reused:
                raise
        # A pooled connection died under us: a keep-alive race, not the host. Once, fresh.
        return await upstream.send(method, url, headers, payload, fresh=True)

    def _account(self, ex: Exchange) -> None:
        app = self.app
        now = app.clock.seconds()
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
        app.record(row)
        if tokens and tokens.prompt and ex.chars:
            app.guard.learn(ex.model, ex.chars, tokens.prompt)
        if ex.meter is not None and ex.meter.ids and not ex.remembered:
            app.ids.remember(ex.meter.ids, ex.host, ex.fp, now)
