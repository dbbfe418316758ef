"""Prewarm: replay a conversation's latest prompt on a host, generating nothing, so its next
turn there finds the prompt in the host's cache.

The kept body (kept.py) goes to the host with generation suppressed the way
llama-server reads it (`n_predict: 0`, which every llama-server endpoint reads before the
OpenAI/Anthropic `max_tokens`; `max_tokens: 0` as well; `cache_prompt: true`; not streamed).
It takes a slot through the limiter like a request, at PREWARM_PRIORITY, below every route,
so no client waits in a queue behind it; and a client that must queue where a prewarm holds a
slot takes that slot (the prewarm is aborted and tried again once the queue is empty). At
most `server.prewarm_parallel` prewarms run per host. Each is recorded as a usage row whose
`lease` is "prewarm", counted apart (`crossbar_prewarm_tokens_total`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from attrs import define, frozen
from prometheus_client import CollectorRegistry, Counter
from twisted.internet.defer import CancelledError, Deferred, DeferredSemaphore
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from crossbar.config import PREWARM_PRIORITY, Config, RouteLimits
from crossbar.handoff.kept import HandoffStore
from crossbar.hosts import Hosts
from crossbar.leases import Key
from crossbar.limiter import Limiter, LimiterError
from crossbar.proxy import UsageRecorder
from crossbar.wire import Exchange, Kind, Tokens, Upstream, UpstreamFailure, classify, renamed_body

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from crossbar.tracing import Tracing

log = Logger(namespace="crossbar.prewarm")
# The client APIs whose prompt a replay can warm without generating: llama-server reads
# n_predict on each. (/v1/responses is left out: a chained turn names a response only the
# old host holds.)
PREWARMABLE = frozenset(
    {
        "/v1/chat/completions",
        "/chat/completions",
        "/v1/completions",
        "/completions",
        "/completion",
        "/infill",
        "/v1/messages",
    }
)
PREWARM_LIMITS = RouteLimits(name="(prewarm)", priority=PREWARM_PRIORITY)
_ATTEMPTS = 3  # a prewarm a client took the slot from is tried again, this often in all
# Output-limit fields a client may have set, dropped so that only the zero limits speak.
_LIMIT_KEYS = ("max_completion_tokens", "max_output_tokens", "stream_options", "id_slot")


def suppressed(body: dict[str, Any]) -> dict[str, Any]:
    """`body` asking the host to process its prompt, keep it cached and generate nothing."""
    out = {k: v for k, v in body.items() if k not in _LIMIT_KEYS}
    out.update(n_predict=0, max_tokens=0, stream=False, cache_prompt=True)
    return out


def pack(path: str, raw: bytes) -> bytes:
    """A kept body: its llama-server path, a NUL, the client's raw body."""
    return path.encode() + b"\0" + raw


def unpack(blob: bytes) -> tuple[str, bytes]:
    path, _, raw = blob.partition(b"\0")
    return path.decode("utf-8", "replace"), raw


@frozen
class Outcome:
    """How a prewarm went: "warm", "no body" (nothing kept to replay), "failed"."""

    result: str
    prompt_tokens: int = 0
    cached_tokens: int = 0
    detail: str = ""


@define(eq=False)
class _Running:
    deferred: Deferred[Any]
    preempted: bool = False


class Prewarmer:
    """Sends kept bodies to hosts, generation suppressed, below every client request."""

    def __init__(
        self,
        clock: IReactorTime,
        config: Config,
        hosts: Hosts,
        limiter: Limiter,
        upstream: Upstream,
        store: HandoffStore,
        usage: UsageRecorder,
        registry: CollectorRegistry,
        tracing: Tracing | None = None,
    ) -> None:
        self._clock = clock
        self._tracing = tracing
        self._config = config
        self._hosts = hosts
        self._limiter = limiter
        self._upstream = upstream
        self._store = store
        self._usage = usage
        self._gates: dict[str, DeferredSemaphore] = {}
        self._running: dict[tuple[str, str], list[_Running]] = {}
        self.tokens = Counter(
            "crossbar_prewarm_tokens",
            "Prompt tokens sent by prewarms (warm hand-offs), by host and kind: prompt (all "
            "of it) and cached (already in the host's cache).",
            ["host", "kind"],
            registry=registry,
        )

    def reconfigure(self, config: Config) -> None:
        """A new prewarm_parallel applies to hosts with no prewarm running."""
        self._config = config
        self._gates = {h: g for h, g in self._gates.items() if g.tokens < g.limit}

    async def prewarm(self, key: Key, host: str, parent: Span | None = None) -> Outcome:
        """Replay `key`'s kept body on `host`, generating nothing (its span under `parent`,
        the move's, when tracing is on)."""
        blob = await self._store.load(key)
        if blob is None:
            return Outcome("no body")
        path, raw = unpack(blob)
        try:
            body = json.loads(raw)
        except ValueError:
            return Outcome("failed", detail="kept body is not JSON")
        if path not in PREWARMABLE or not isinstance(body, dict):
            return Outcome("no body")
        gate = self._gates.get(host)
        if gate is None:
            gate = self._gates[host] = DeferredSemaphore(self._config.server.prewarm_parallel)
        await gate.acquire()
        try:
            for _ in range(_ATTEMPTS):
                outcome = await self._attempt(key, host, path, suppressed(body), parent)
                if outcome is not None:
                    return outcome
            return Outcome("failed", detail="clients kept taking the slot")
        finally:
            gate.release()

    async def _attempt(
        self, key: Key, host: str, path: str, body: dict[str, Any], parent: Span | None
    ) -> Outcome | None:
        """One try; None when a client took the slot (try again)."""
        host_config = self._config.hosts.get(host)
        if host_config is None:
            return Outcome("failed", detail=f"host {host} is not in the config")
        try:
            release = await self._limiter.acquire(host, key.model, PREWARM_LIMITS)
        except LimiterError as e:
            return Outcome("failed", detail=str(e))
        ex = Exchange(started=self._clock.seconds(), route=key.route, path=path, fp=key.fp)
        ex.model, ex.host, ex.lease = key.model, host, "prewarm"
        pair = (host, key.model)
        sending = self._send(host_config, path, body, ex, parent)
        running = _Running(Deferred.fromCoroutine(sending))
        self._running.setdefault(pair, []).append(running)
        try:
            return await running.deferred
        except CancelledError:
            if running.preempted:
                ex.status, ex.error = 499, "prewarm gave its slot to a client"
                return None
            raise
        finally:
            release()
            self._running[pair].remove(running)
            if not self._running[pair]:
                del self._running[pair]
            self._usage.finish(ex)

    async def _send(
        self,
        host_config: Any,
        path: str,
        body: dict[str, Any],
        ex: Exchange,
        parent: Span | None,
    ) -> Outcome:
        model = self._hosts.model(host_config.name, ex.model)
        tracing, span = self._tracing, None
        extra: list[tuple[bytes, bytes]] = []
        sent = self._clock.seconds()
        if tracing is not None and parent is not None:
            upstream_model = model.upstream_name if model is not None else ex.model
            span = tracing.prewarm(parent, path, body, ex.fp, ex.model, host_config, upstream_model)
            extra = tracing.headers(span)
        try:
            status, answer = await self._upstream.post_json(
                host_config, path, renamed_body(body, model), extra
            )
        except UpstreamFailure as failure:
            ex.status, ex.error = 502, f"upstream {failure.reason}"
            if span is not None and tracing is not None:
                tracing.end(span, None, failure.reason.replace(" ", "_"))
            return Outcome("failed", detail=ex.error)
        except BaseException:
            if span is not None and tracing is not None:
                tracing.end(span, None, "cancelled")  # a client took its slot, or a stop
            raise
        ex.first_byte = self._clock.seconds()  # the whole answer: nothing streams here
        ex.status = status
        tokens = Tokens()
        dialect, kind = classify("POST", path)
        try:
            obj = json.loads(answer)
        except ValueError:
            obj = None
        if kind is Kind.INFERENCE:
            dialect.read_usage(obj, tokens)
        ex.tokens = tokens
        if span is not None and tracing is not None:
            tracing.answered(span, ex, sent)
        if status != 200:
            ex.error = f"host answered {status}"
            return Outcome("failed", detail=f"{ex.error}: {answer[:200]!r}")
        self.tokens.labels(ex.host, "prompt").inc(tokens.prompt)
        self.tokens.labels(ex.host, "cached").inc(tokens.cached)
        return Outcome("warm", tokens.prompt, tokens.cached)

    def client_waits(self, host: str, model: str, priority: int) -> None:
        """A request queued at (host, model): a prewarm there gives up its slot to it."""
        if priority <= PREWARM_PRIORITY or self._limiter.free_slots(host, model) > 0:
            return  # another prewarm, or a client held back by its route's cap, not a slot
        running = [r for r in self._running.get((host, model), ()) if not r.preempted]
        if running:
            newest = running[-1]
            newest.preempted = True
            newest.deferred.cancel()
