"""A request understood: what it is for (`Target`) read into what it asks of a host (`Call`):
its body (output limits applied), model, conversation fingerprint, lease key, prompt size,
and the host of the running completion a control call names."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.interfaces import IReactorTime

from crossbar.config import Config
from crossbar.hosts import Hosts
from crossbar.leases import Key
from crossbar.proxy.call import Call, Target
from crossbar.proxy.fingerprint import conversation, scoped
from crossbar.proxy.guard import ContextGuard
from crossbar.proxy.ids import IdMemory
from crossbar.proxy.routing import choose_model
from crossbar.wire import (
    Exchange,
    Inbound,
    Kind,
    bad_request,
    header_reader,
    limit_output,
    request_body,
)


def _query(uri: bytes) -> str:
    """The query of a request target (after `?`, before any `#`)."""
    cut = uri.find(b"?")
    if cut < 0:
        return ""
    return uri[cut + 1 :].split(b"#", 1)[0].decode("utf-8", "replace")


class CallReader:
    """Reads each request's `Call`, from the hosts serving its route and the completion ids
    crossbar remembers."""

    def __init__(
        self, clock: IReactorTime, hosts: Hosts, ids: IdMemory, guard: ContextGuard
    ) -> None:
        self._clock = clock
        self._hosts = hosts
        self._ids = ids
        self._guard = guard

    def read(
        self, config: Config, request: Any, ex: Exchange, target: Target, kind: Kind, tenant: str
    ) -> Call:
        """Body, model, fingerprint and lease key of a request for a host (its model, its
        fingerprint and prompt size noted on `ex`); `tenant` the named key's name ("" for
        none), which scopes the fingerprint."""
        try:
            return self._read(config, request, ex, target, kind, tenant)
        except RecursionError:
            raise bad_request("the request body is nested too deeply to be read") from None

    def need(self, prompt_chars: int, model: str) -> int:
        """Prompt tokens a request of `prompt_chars` characters is expected to bring."""
        return round(prompt_chars * self._guard.ratio(model))

    def _read(
        self, config: Config, request: Any, ex: Exchange, target: Target, kind: Kind, tenant: str
    ) -> Call:
        route, dialect, method, path = target.route, target.dialect, target.method, target.path
        raw = request.body
        body = request_body(kind, dialect, method, path, raw)
        if kind is Kind.INFERENCE and route.limits_output:
            limited = limit_output(
                body, dialect.output_fields, route.max_tokens_default, route.max_tokens_cap
            )
            if limited is not None:
                body, raw = limited, json.dumps(limited).encode()
        query = _query(request.uri)
        peer = getattr(request.getClientAddress(), "host", "") or ""
        headers, secure = request.requestHeaders, request.isSecure()
        inbound = Inbound(method, path, query, raw, body, headers, peer, secure)
        serving = self._hosts.serving(route)
        ex.model = model = choose_model(route, serving.models, body, query)
        candidates = serving.candidates(model)
        chars, inference = config.server.fingerprint_chars, kind is Kind.INFERENCE
        fp, opening = conversation(header_reader(headers), body, dialect, chars, inference)
        ex.fp = scoped(fp, tenant)
        unscoped = fp if ex.fp != fp else ""
        if inference:
            ex.prompt_chars = dialect.prompt_chars(body)
        origin = None
        named = dialect.named_id(path, body) if isinstance(body, dict) else None
        if isinstance(named, str) and named:
            remembered = self._ids.lookup(named, self._clock.seconds())
            if remembered is not None:
                if remembered.fp:
                    # a Responses chain is its first response's conversation
                    ex.fp, unscoped = remembered.fp, ""
                # A control call acts on one running completion: it goes where that runs,
                # pinned route or not. A Responses chain only takes its conversation's lease.
                if kind is Kind.CONTROL and remembered.host in candidates:
                    origin = remembered.host
        key = Key(route.name, "" if route.per_route() else ex.fp, model)
        need = self.need(ex.prompt_chars, model)
        unscoped = unscoped if key.fp else ""
        return Call(
            route,
            dialect,
            kind,
            inbound,
            model,
            key,
            candidates,
            origin,
            need,
            opening,
            unscoped=unscoped,
        )
