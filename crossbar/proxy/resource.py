"""The client-facing Resource: one request's sequence (docs/reference.md, "The request path").

route → dialect → model → fingerprint → lease → guard → slot → upstream → relay → usage

Each step is another module's; this one only orders them, answers what crossbar answers
itself, and hands each running request to `Running` (running.py), which a stop drains.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from attrs import evolve
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from crossbar.config import Config, HostConfig, ModelConfig, Route
from crossbar.hosts import Hosts
from crossbar.leases import Acquired, Key, LeaseError, NoHost
from crossbar.limiter import Limiter, Release, Work
from crossbar.proxy import cors, pace, swapping, traced
from crossbar.proxy.answers import answer_json, models_list, route_health
from crossbar.proxy.call import Call, Target
from crossbar.proxy.charges import Charges
from crossbar.proxy.classes import request_class
from crossbar.proxy.fallback import (
    HOST_BUSY,
    HOST_REFUSED,
    NO_HOST,
    CannotServe,
    cannot_serve,
    fallback_call,
    fallback_model,
    host_busy,
    may_fall_back,
)
from crossbar.proxy.guard import ContextGuard
from crossbar.proxy.ids import IdMemory
from crossbar.proxy.inside import InsideAnswer, InsideRequest
from crossbar.proxy.loaded import LoadedModels
from crossbar.proxy.placement import Placement
from crossbar.proxy.refusals import Where, for_exception, for_key
from crossbar.proxy.resume import REFUSED, Continuation, Resume, Resumer, combined
from crossbar.proxy.routing import (
    authenticate,
    authenticate_named,
    check_model_scope,
    credentials,
    resolve_route,
    split_route,
)
from crossbar.proxy.running import Running
from crossbar.proxy.slot import SlotStep
from crossbar.proxy.understand import CallReader
from crossbar.proxy.usage import UNKNOWN_ROUTE, UsageRecorder
from crossbar.proxy.valve import Replace, Valve
from crossbar.tenants import ClientKey, KeyRefused, Reservation, Tenants
from crossbar.wire import (
    CONNECTIONS_BUSY,
    INTERNAL,
    OPENAI_CHAT,
    ClientError,
    ContinuationRelay,
    Exchange,
    Inbound,
    KeepingRelay,
    Kind,
    Outgoing,
    Relay,
    Tokens,
    Transcript,
    Upstream,
    UpstreamFailure,
    classify,
    continuation_family,
    header_reader,
    not_found,
    prepare,
    read_body,
    renamed_body,
    unavailable,
    write_error,
)

if TYPE_CHECKING:
    from crossbar.tracing import RequestTrace, Tracing

log = Logger(namespace="crossbar.proxy")
_REMOVED_RETRIES = 3  # a reload may remove the host a request waited for; place it again
MAX_STOPS = 2  # times a batch request is stopped for a waiting turn, at most


def stoppable(call: Call, work: Work, stopped: int) -> bool:
    """Whether the limiter may stop `call` for a waiting turn: a batch request its route lets
    be stopped (`work.yield_after`), not streamed (its client sees nothing until the whole
    answer), stopped fewer than MAX_STOPS times so far."""
    body = call.inbound.body
    streamed = isinstance(body, dict) and body.get("stream") is True
    return work.yield_after is not None and stopped < MAX_STOPS and not streamed


def _stop(yielded: list[bool], sending: Deferred[Any]) -> None:
    yielded.append(True)
    sending.cancel()  # the host's connection closes: it stops generating


# A host's failures after it had the request that an inference answer may run again for:
# it died (or closed) or went silent. An answer that is not HTTP is the host's misconfiguration.
RERUN_CAUSES = ("reset", "idle timeout")
_BUSY = (429, 503)  # a host's answers that say "not now": a fallback route may serve instead


class TurnGate(Protocol):
    """What an inference turn tells of itself and waits for (the warm hand-off, handoff/moves.py,
    implements it): a move of its conversation under way, while it runs, once answered."""

    async def wait_for_move(self, key: Key) -> None: ...

    def in_flight(self, key: Key) -> AbstractContextManager[None]: ...

    def answered(self, key: Key, ex: Exchange, inbound: Inbound) -> None: ...


class _Open:
    """A gate with nothing behind it: no hand-offs."""

    async def wait_for_move(self, key: Key) -> None:
        return None

    def in_flight(self, key: Key) -> AbstractContextManager[None]:
        return nullcontext()

    def answered(self, key: Key, ex: Exchange, inbound: Inbound) -> None:
        return None


OPEN = _Open()


class BatchFront(Protocol):
    """The Batch API's files and batches on the client port (crossbar.batches implements it):
    it answers `request` itself, for `route` and the request's named key, and says the
    status it answered."""

    async def serve(
        self, request: Any, route: Route, key: ClientKey | None, method: str, path: str
    ) -> int: ...


def _route_template(raw_path: str, path: str, kind: Kind | None) -> str | None:
    """The request's `http.route`: crossbar's URL with the route name left out, for a path
    crossbar serves (None for any other: a client's invented path is no template)."""
    if kind is None:
        return None
    shown = "/slots/{id}" if path.startswith("/slots/") else path
    return "/r/{route}" + shown if raw_path.startswith("/r/") else shown


class ProxyResource(Resource):
    """Every client path; one coroutine per request, cancelled when the client goes away."""

    isLeaf = True

    def __init__(
        self,
        config: Config,
        clock: IReactorTime,
        hosts: Hosts,
        limiter: Limiter,
        upstream: Upstream,
        guard: ContextGuard,
        ids: IdMemory,
        usage: UsageRecorder,
        placement: Placement,
        gate: TurnGate | None = None,
        tenants: Tenants | None = None,
        tracing: Tracing | None = None,
        valve: Valve | None = None,
        loaded: LoadedModels | None = None,
        batches: BatchFront | None = None,
    ) -> None:
        """`tracing`: crossbar's spans (None, the default: tracing off, and no cost);
        `valve`: moves queued turns where they start sooner (None: every turn waits at home);
        `loaded`: which models router-mode hosts have loaded (None: every model always is);
        `batches`: the Batch API (None: its paths are 404)."""
        super().__init__()
        self._slots = SlotStep(clock, limiter, placement, tenants, valve)
        self._tenants = tenants
        self._config = config
        self._clock = clock
        self._hosts = hosts
        self._limiter = limiter
        self._upstream = upstream
        self._guard = guard
        self._calls = CallReader(clock, hosts, ids, guard)
        self._usage = usage
        self._placement = placement
        self._gate = gate or OPEN
        self._tracing = tracing
        self._loaded = loaded
        self._batches = batches
        self._running = Running(clock)
        self._resumer = Resumer(clock, placement)
        self._charges = (
            None
            if tenants is None
            else Charges(tenants.meter, clock, limiter.rates, placement, hosts)
        )

    def reconfigure(self, config: Config) -> None:
        """Serve the reloaded config from the next request on."""
        self._config = config

    @property
    def resumer(self) -> Resumer:
        """Answers that survive their host: what an evacuation stops to move (resume.py)."""
        return self._resumer

    @property
    def running(self) -> int:
        """Requests being handled now."""
        return len(self._running)

    # -- lifecycle of one request, and of all of them

    def render(self, request: Any) -> Any:
        ex = Exchange(started=self._clock.seconds())
        tracing = self._tracing
        if tracing is not None:
            ex.trace = tracing.request(request, ex.started)
        # Asked for before serving: a request answered at once never fires a later notice.
        finished = request.notifyFinish()
        d = Deferred.fromCoroutine(self._serve(request, ex))
        finished.addErrback(lambda _: d.cancel())
        d.addErrback(self._crashed, request)
        if not d.called:
            self._running.track(request, d, ex)
        return NOT_DONE_YET

    def inside(self, request: InsideRequest) -> Deferred[InsideAnswer]:
        """Run a request crossbar makes of itself through the whole sequence (inside.py); its
        answer."""
        self.render(request)
        return request.answered

    async def drain(self, grace: float) -> int:
        """Let running requests finish for up to `grace` seconds, then abort the rest
        (`Running.drain`); how many were aborted."""
        return await self._running.drain(grace)

    def _crashed(self, failure: Failure, request: Any) -> None:
        # Last resort: _serve handles its own errors, so only a bug in that handling gets here.
        if failure.check(CancelledError):
            return
        log.failure("request failed inside crossbar", failure)
        write_error(request, INTERNAL)

    async def _serve(self, request: Any, ex: Exchange) -> None:
        dialect = OPENAI_CHAT
        try:
            raw_path = request.path.decode("utf-8", "replace")
            header = header_reader(request.requestHeaders)
            name, path = split_route(self._config, raw_path, header("X-Crossbar-Route"))
            method = request.method.decode("ascii", "replace")
            dialect, kind = classify(method, path)
            ex.path = path
            route = resolve_route(self._config, name)
            if ex.trace is not None:
                ex.trace.routed(route.name, _route_template(raw_path, path, kind))
            cors.mark(request, route, header)
            if method == "OPTIONS" and route.cors_origins:
                cors.preflight(request, route, header)  # crossbar's own: no lease, no row
                return
            ex.route = route.name
            await self._handle(request, ex, Target(route, dialect, kind, method, path))
        except ClientError as e:
            ex.status, ex.error = e.status, ex.error or e.message
            write_error(request, e, dialect)
        except CancelledError:
            ex.status = ex.status or (503 if ex.error == "shutdown" else 499)
            ex.error = ex.error or "client disconnected"
        except Exception:
            log.failure("request failed inside crossbar")
            ex.status, ex.error = 500, "internal error"
            write_error(request, INTERNAL, dialect)
        finally:
            if ex.trace is not None:
                ex.trace.finish(ex, ex.status or request.code)
            if ex.route:
                self._usage.finish(ex)
            elif ex.status:  # refused before its route was known; a preflight has no status
                ex.route = UNKNOWN_ROUTE
                self._usage.refused(ex, getattr(request.getClientAddress(), "host", "") or "")

    async def _handle(self, request: Any, ex: Exchange, target: Target) -> None:
        route, kind = target.route, target.kind
        book = self._tenants.book if self._tenants is not None else None
        try:
            now = self._clock.seconds()
            if isinstance(request, InsideRequest):  # crossbar's own: its key known by name
                key = authenticate_named(route, book, request.key, now)
            else:
                authorization, api_key = credentials(request.requestHeaders)
                key = authenticate(route, book, authorization, api_key, now)
        except KeyRefused as e:
            raise for_key(e) from None
        if key is not None:
            ex.key = key.name
            request.responseHeaders.setRawHeaders(b"X-Crossbar-Key", [key.name.encode()])
        if kind is None:
            raise not_found(f"crossbar does not serve {target.method} {target.path}")
        if kind is Kind.MODELS:
            served = self._hosts.serving(route).models
            models = models_list(served, route.aliases)
            ex.status = answer_json(request, models)
            return
        if kind is Kind.HEALTH:
            ex.status = answer_json(request, route_health(route, self._hosts))
            return
        if kind is Kind.BATCHES:
            if self._batches is None:
                raise not_found(f"crossbar does not serve {target.method} {target.path} here")
            ex.status = await self._batches.serve(request, route, key, target.method, target.path)
            return
        tenant = key.name if key is not None else ""
        call = self._calls.read(self._config, request, ex, target, kind, tenant)
        if kind is Kind.INFERENCE:
            headers = request.requestHeaders
            ex.request_class = request_class(headers, call.inbound.body, route, key)
            if ex.request_class != call.request_class:  # not standard: no copy per request
                call = evolve(call, request_class=ex.request_class)
            request.responseHeaders.setRawHeaders(b"X-Crossbar-Class", [ex.request_class.encode()])
        try:
            check_model_scope(key, route, call.model)
        except KeyRefused as e:
            raise for_key(e) from None
        if kind is not Kind.INFERENCE:
            await self._forward(request, call, ex)
            return
        gate = self._gate  # a move of the conversation may be under way
        await gate.wait_for_move(call.key)
        charged: list[Reservation] = []
        served = call
        try:
            try:
                with gate.in_flight(call.key):
                    await self._resumer.answer(self._forward, request, call, ex, key, charged)
            except CannotServe as cannot:
                served = await self._fall_back(request, call, ex, key, charged, cannot)
        finally:
            # What was delivered, however the answer ended (an answer relayed whole settled
            # already, before its request finished: a no-op then).
            if self._charges is not None:
                self._charges.settle(charged, ex.tokens)
        if not served.batch:  # a batch request is no turn of a conversation to hand off
            gate.answered(served.key, ex, served.inbound)

    async def _fall_back(
        self,
        request: Any,
        call: Call,
        ex: Exchange,
        key: ClientKey | None,
        charged: list[Reservation],
        cannot: CannotServe,
    ) -> Call:
        """`call`'s route could not serve it (`cannot`): its fallback routes are tried in
        order, each as its own request would go there (a lease of the conversation's own, its
        queue, its hosts); the call that served, or `cannot`'s error when none did. The
        conversation's lease at home stays where it is: its next turn tries home first."""
        first = call.route.name
        for name in call.route.fallbacks:
            fallback = self._fallback_call(request, call, ex, key, name)
            if fallback is None:
                continue
            ex.route, ex.model, ex.fallback_from, ex.fallback_reason = (
                name,
                fallback.model,
                first,
                cannot.reason,
            )
            ex.host = ex.lease = ex.error = ""
            request.responseHeaders.setRawHeaders(b"X-Crossbar-Fallback", [name.encode()])
            if ex.trace is not None:
                ex.trace.fell_back(name, cannot.reason)
            gate = self._gate
            try:
                await gate.wait_for_move(fallback.key)
                with gate.in_flight(fallback.key):
                    await self._resumer.answer(self._forward, request, fallback, ex, key, charged)
            except CannotServe:
                continue  # this one cannot either: the next
            return fallback
        ex.route, ex.model, ex.fallback_from, ex.fallback_reason = first, call.model, "", ""
        request.responseHeaders.removeHeader(b"X-Crossbar-Fallback")
        raise cannot.error

    def _fallback_call(
        self, request: Any, call: Call, ex: Exchange, key: ClientKey | None, name: str
    ) -> Call | None:
        """`call` as fallback route `name` would take it, or None where it may not: no such
        route, one the request's key does not cover (or one that needs a key it lacks), or
        no model there for it."""
        route = self._config.route(name)
        if route is None or route.name == call.route.name:
            return None
        book = self._tenants.book if self._tenants is not None else None
        now = self._clock.seconds()
        try:
            if isinstance(request, InsideRequest):
                authenticate_named(route, book, request.key, now)
            else:
                authorization, api_key = credentials(request.requestHeaders)
                authenticate(route, book, authorization, api_key, now)
        except KeyRefused:
            return None  # a key falls back only to routes it covers
        serving = self._hosts.serving(route)
        inbound = call.inbound
        model = fallback_model(route, serving.models, inbound.body, inbound.query, call.model)
        if not model:
            return None
        try:
            check_model_scope(key, route, model)
        except KeyRefused:
            return None
        need = self._calls.need(ex.prompt_chars, model)
        return fallback_call(call, route, model, ex.fp, serving.candidates(model), need)

    # -- the way to a host and back

    async def _forward(
        self,
        request: Any,
        call: Call,
        ex: Exchange,
        key: ClientKey | None = None,
        charged: list[Reservation] | None = None,
        continuation: Continuation | None = None,
    ) -> Relay | None:
        """Place, check, queue, send and relay `call` (a `continuation` of an answer already
        streaming, when given); the relay that ran (None for a host's busy answer read)."""
        failed: tuple[str, UpstreamFailure] | None = None  # the host that just failed, and how
        removed = 0  # placed again because a reload removed the host, or the valve lost a race
        judged = False  # the valve had its say on this turn: one move at most per turn
        moves = swapping.Moves(self._clock)  # a router-mode host's model moving under it
        stopped = 0  # times this batch request was stopped for a waiting turn
        trace = ex.trace
        loaded = self._loaded
        while True:
            if trace is None:
                acquired = await self._place(call, failed)
            else:
                placing = partial(self._place, call, failed)
                acquired = await traced.place(trace, self._placement, call, placing)
            ex.host = host = acquired.host
            ex.lease = "pinned" if acquired.pinned else "reused" if acquired.reused else "new"
            exact = None
            if call.kind is Kind.INFERENCE:
                try:
                    exact = await self._check_context(call, host, ex)
                    if key is not None and charged is not None and not charged:
                        assert self._charges is not None  # a key: tenants
                        charged.append(self._charges.reserve(call, key, acquired, exact))
                except ClientError:
                    await self._placement.refused(call, acquired)  # places nothing
                    raise
            # Made before the wait, so that a freed slot's next request goes out at once.
            ready = self._prepare(call, host)
            try:
                release, host, work = await self._slots.take(
                    call, acquired, ex, key, exact, partial(self._where, call), judged, stopped > 0
                )
            except Replace:
                judged = True
                removed += 1
                if removed < _REMOVED_RETRIES:
                    continue
                raise unavailable(
                    "the conversation's host changed as it waited; try again", 1
                ) from None
            if host != acquired.host:  # the valve moved it: its lease is there now
                judged = True
                acquired = evolve(acquired, host=host, reused=False)
            yielded: list[bool] = []  # stopped for a waiting turn (a batch request)
            host_config = self._config.hosts.get(host)
            if host_config is None:  # a reload removed it while we waited
                release()
                removed += 1
                if removed < _REMOVED_RETRIES:
                    continue
                raise unavailable(f"host {host} was removed from the config; try again", 1)
            try:
                model = self._hosts.model(host, call.model)
                if ready is None or ready[:2] != (host_config, model):
                    ready = self._prepare(call, host)  # moved, or reloaded, as it waited
                    assert ready is not None
                out = ready[2]
                if trace is not None:
                    out = self._attempt(trace, call, ex, host_config, model, out)
                sent = self._clock.seconds()
                loading = None
                if loaded is not None and call.kind is Kind.INFERENCE:
                    loading = loaded.sent(host, call.model)  # a load it waits for, if any
                # The slot frees the moment the host's answer has all been read: the next
                # waiter's request goes before this answer's end is relayed and recorded.
                if work is None or not stoppable(call, work, stopped):
                    response = await self._upstream.send(out, on_done=release)
                else:  # a batch request a turn may stop: the limiter holds its stop
                    sending = Deferred.fromCoroutine(self._upstream.send(out, on_done=release))
                    work.stop = partial(_stop, yielded, sending)
                    self._limiter.may_stop(host, call.model)
                    try:
                        response = await sending
                    finally:
                        work.stop = None
            except CancelledError:
                release()
                if not yielded:
                    raise  # the client left
                stopped += 1  # stopped for a turn: nothing reached the client; again, first
                if charged and self._charges is not None:
                    self._charges.stopped(call, acquired, charged, host, exact, sent)
                continue
            except UpstreamFailure as failure:
                release()
                if trace is not None:
                    trace.failed(failure.reason.replace(" ", "_"))
                ex.error = f"upstream {failure.reason}"
                error = for_exception(failure, self._where(call, host))
                if failure.connecting and not failure.blameless:
                    ejected = self._hosts.passive_failure(host, failure.reason, call.candidates)
                    if ejected and call.kind is Kind.INFERENCE and failed is None:
                        # A second host, the only one: the lease moves (unhealthy) on this
                        # acquire. A request is tried on at most two hosts in all.
                        failed = (host, failure)
                        continue
                    raise cannot_serve(call, acquired.pinned, HOST_REFUSED, error) from None
                if failure.reason == CONNECTIONS_BUSY:  # the host is as busy as a 503 says
                    raise cannot_serve(call, acquired.pinned, HOST_BUSY, error) from None
                rerun = failure.reason in RERUN_CAUSES and call.kind is Kind.INFERENCE
                if rerun and continuation is None:
                    # The host had it and died or went silent before a byte of answer: nothing
                    # reached the client, and the answer may run again elsewhere.
                    cause = failure.reason.replace(" ", "_")
                    again = await self._resumer.again(request, call, ex, host, cause)
                    if again is not None:
                        call, failed, judged = again, None, False
                        continue
                raise error from None
            except BaseException:
                release()
                raise
            if loaded is not None and response.code in swapping.STATUSES and loaded.router(host):
                answer = await swapping.read_moving(response, release)
                if answer is None:  # the model is moving there: wait for it, then again
                    load = self._limiter.rates.load(host, call.model)
                    await moves.wait(ex, host, call.model, load)
                    continue
                response = answer
            if response.code in _BUSY and may_fall_back(call, acquired.pinned):
                # Busy before any byte reached the client: a fallback may serve it.
                raise await self._busy(call, ex, host, response, release)
            try:
                relay = await self._relay(request, call, ex, response, work, charged, continuation)
            finally:
                release()
            if relay.cut and not relay.stream:  # a whole answer held back: the client saw nothing
                again = await self._resumer.again(request, call, ex, host, relay.cut)
                if again is None:
                    relay.end_cut()
                    return relay
                call, failed, judged = again, None, False
                continue
            if call.kind is Kind.INFERENCE and continuation is None:
                now = self._clock.seconds()
                load = pace.learn(self._limiter.rates, call, ex, sent, now, loading)
                if loaded is not None and ex.status == 200:
                    loaded.answered(host, call.model, loading, load)
            await self._placement.answered(call, acquired, ex.status, ex.tokens)
            if ex.status == 200 and not relay.cut and call.kind is Kind.INFERENCE:
                self._resumer.answered(call, ex, request.requestHeaders)
            return relay

    def _prepare(
        self, call: Call, host: str
    ) -> tuple[HostConfig, ModelConfig | None, Outgoing] | None:
        """The request `host` gets for `call`, with the host and model it was made for (None:
        the config has no such host now)."""
        host_config = self._config.hosts.get(host)
        if host_config is None:
            return None
        model = self._hosts.model(host, call.model)
        return host_config, model, prepare(host_config, model, call.inbound)

    def _attempt(
        self, trace: RequestTrace, call: Call, ex: Exchange, host: HostConfig,
        model: ModelConfig | None, out: Outgoing,
    ) -> Outgoing:  # fmt: skip
        """Begin an attempt's CLIENT span; `out` carrying its trace context to the host."""
        upstream_model = model.upstream_name if model is not None else call.model
        span = trace.attempt(
            call.inbound, call.model, ex.fp, host, upstream_model, call.route.record_content
        )
        return trace.tracing.inject(out, span)

    def _where(self, call: Call, host: str = "") -> Where:
        return Where(
            call.route.name,
            call.model,
            host,
            retry_after=self._config.server.health_interval,
            queued=self._limiter.queued(host, call.model) if host else 0,
        )

    async def _busy(
        self, call: Call, ex: Exchange, host: str, response: Any, release: Release
    ) -> CannotServe:
        """The host answered 429 or 503 before any byte went to the client: its answer is
        read (the connection stays good) and kept as the error the client gets if no fallback
        serves the request."""
        try:
            body = await read_body(response)
        finally:
            release()
        ex.error = f"host answered {response.code}"
        return host_busy(host, response.code, response.headers.getRawHeaders(b"retry-after"), body)

    async def _place(self, call: Call, failed: tuple[str, UpstreamFailure] | None) -> Acquired:
        """The host for this call (placement.py), lease errors in the caller's terms."""
        try:
            return await self._placement.place(call)
        except NoHost as e:
            if failed is not None:  # the host that just failed was the last one left
                error = for_exception(failed[1], self._where(call, failed[0]))
                raise cannot_serve(call, False, HOST_REFUSED, error) from None
            raise cannot_serve(call, False, NO_HOST, for_exception(e, self._where(call))) from None
        except LeaseError as e:
            raise for_exception(e, self._where(call)) from None

    async def _check_context(self, call: Call, host: str, ex: Exchange) -> int | None:
        """Refuse what cannot fit in the host's slot before anything goes upstream
        (docs/reference.md, "Context guard"); the host's exact count of the prompt, when it
        was asked for one."""
        host_config = self._config.hosts.get(host)
        if host_config is None:
            return None
        body = renamed_body(call.inbound.body, self._hosts.model(host, call.model))

        async def count() -> int | None:
            return await self._upstream.count_tokens(host_config, call.dialect, body)

        limit = self._hosts.ctx(host, call.model)
        if ex.trace is None:
            return await self._guard.check(call.model, host, limit, ex.prompt_chars, count)
        check = partial(self._guard.check, call.model, host, limit, ex.prompt_chars)
        return await traced.guard(ex.trace, check, count, host, limit)

    async def _relay(
        self,
        request: Any,
        call: Call,
        ex: Exchange,
        response: Any,
        work: Work | None = None,
        charged: list[Reservation] | None = None,
        continuation: Continuation | None = None,
    ) -> Relay:
        host, fp, trace = ex.host, ex.fp, ex.trace

        def remember(id_: str) -> None:
            self._usage.remember_id(id_, host, fp)
            if trace is not None:
                trace.response_id(id_)

        timeouts = (self._upstream.idle_timeout, self._config.server.client_write_timeout)
        # The key's charge is settled before the request finishes: finishing lets the
        # channel read a request pipelined behind it, which must find this one's place in
        # the key's max_in_flight given back (and its true cost in the minute and budgets).
        settle = partial(self._charges.settle, charged) if charged and self._charges else None
        relay: Relay
        if continuation is not None:
            return await self._continue(request, call, ex, response, continuation, settle)
        resumer = self._resumer
        transcript = None
        if resumer.may_continue(call):  # a family crossbar continues, on a route that does
            kind = continuation_family(call.dialect, call.inbound.path)
            transcript = None if kind is None else Transcript(kind)
        hold = resumer.holds(call)
        if trace is not None and call.route.record_content:
            # A route that records contents keeps the answer's first bytes for its span.
            relay = KeepingRelay(
                request, self._clock, timeouts, call.dialect, host, remember, settle,
                transcript, hold,
            )  # fmt: skip
        else:
            relay = Relay(
                request, self._clock, timeouts, call.dialect, host, remember, settle,
                transcript, hold,
            )  # fmt: skip
        if work is not None:
            work.streamed = relay.streamed  # the expected wait counts what has been written
        extra = [
            (b"X-Crossbar-Host", host.encode()),
            (b"X-Crossbar-Lease", ex.lease.encode()),
            (b"X-Crossbar-Queue-Ms", str(round(ex.queue_ms)).encode()),
        ]
        if ex.resumes:  # ran again elsewhere, having shown nothing: the client may know it
            moved = sum(1 for r in ex.resumes if not r.refused)
            extra.append((b"X-Crossbar-Resumed", str(moved).encode()))
        running = resumer.running(host, relay) if transcript is not None else nullcontext()
        try:
            with running:
                await relay.run(response, extra)
        finally:
            ex.status, ex.stream = relay.status, relay.stream
            ex.first_byte, ex.tokens = relay.first_byte, relay.tokens
            ex.error = relay.error or ex.error
            if trace is not None:
                trace.answered(ex, getattr(relay, "kept", None), relay.error)
        if relay.cause and not relay.cut and relay.stream and call.kind is Kind.INFERENCE:
            # Cut, and ended as ever: an answer the request itself keeps from continuing.
            why = resumer.request_refusal(call)
            if why:
                resume = Resume(relay.cause, why, REFUSED, host, sent=relay.streamed())
                ex.resumes.append(resume)
                resumer.told(ex, resume)
        return relay

    async def _continue(
        self,
        request: Any,
        call: Call,
        ex: Exchange,
        response: Any,
        continuation: Continuation,
        settle: Any,
    ) -> Relay:
        """Relay a continuation's answer into the client's stream (ContinuationRelay)."""
        host, fp, first = ex.host, ex.fp, continuation.first
        pieces = continuation.before.pieces
        timeouts = (self._upstream.idle_timeout, self._config.server.client_write_timeout)
        original = continuation.transcript.id

        def remember(_: str) -> None:  # the client knows the first host's id: it is here now
            if isinstance(original, str) and original:
                self._usage.remember_id(original, host, fp)

        def whole(tokens: Tokens) -> None:
            if settle is not None:
                settle(combined(first, pieces, tokens))

        relay = ContinuationRelay(
            request, self._clock, timeouts, call.dialect, host, remember,
            continuation.splice, continuation.transcript, whole,
        )  # fmt: skip
        try:
            with self._resumer.running(host, relay):
                await relay.run(response)
        finally:
            ex.tokens = combined(first, pieces, relay.tokens)
            ex.error = relay.error
            if ex.trace is not None:
                ex.trace.answered(ex, None, relay.error)
        return relay
