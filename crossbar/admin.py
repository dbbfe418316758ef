"""The admin API, /metrics and the dashboard (SPEC §10): a Klein app on `server.admin_listen`.

JSON in and out; every error is crossbar's OpenAI-style body. It is given the parts it reads
and steers (the table, hosts, limiter, store, metrics) and the service's `reload`; a reload
hands it the new config. Who may call it: `crossbar.admin_auth`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from attrs import asdict
from klein import Klein
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from crossbar import admin_auth
from crossbar.admin_views import (
    host_rows,
    lease_row,
    route_rows,
    since_arg,
    usage_series_args,
)
from crossbar.config import Config, ConfigError
from crossbar.errors import ClientError, bad_request, not_found, unavailable
from crossbar.hosts import Hosts, NoSuchHost
from crossbar.inbound import json_object
from crossbar.journal import StoreUnavailable
from crossbar.lease import Table
from crossbar.limiter import Limiter
from crossbar.metrics import CONTENT_TYPE_LATEST, Metrics
from crossbar.store import USAGE_GROUPS, Store, StoreError
from crossbar.usage import UsageRecorder

log = Logger(namespace="crossbar.admin")
MAX_BODY = 64 * 1024  # admin requests are small JSON objects
MAX_EVENTS = 1000
MAX_ROUTES = 1000
_INTERNAL = ClientError(500, "api_error", "the admin API failed on this request; see the log")

Handler = Callable[..., Awaitable[Any]]
Reload = Callable[[], Awaitable[list[str]]]


class ReloadRefused(Exception):
    """The config file is bad; `errors` are its problems, dotted paths first."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


def api(fn: Handler) -> Handler:
    """Authorize, run the handler, answer its result as JSON (200)."""

    @functools.wraps(fn)
    async def handler(self: Admin, request: Any, **kwargs: Any) -> bytes:
        self.authorize(request)
        return _json(request, 200, await fn(self, request, **kwargs))

    return handler


def _json(request: Any, status: int, payload: Any) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"Content-Type", b"application/json")
    request.setHeader(b"Cache-Control", b"no-store")
    return json.dumps(payload).encode()


def _arg(request: Any, name: str) -> str | None:
    """A query argument; None when it is missing or empty (`?route=` filters nothing)."""
    values = request.args.get(name.encode())
    return values[0].decode("utf-8", "replace") or None if values else None


def _limit(request: Any, most: int, default: int) -> int:
    """The `limit` query argument: a whole number from 1 to `most`, or a 400."""
    text = _arg(request, "limit") or str(default)
    try:
        limit = int(text)
    except ValueError:
        limit = -1
    if not 0 < limit <= most:
        raise bad_request(f"limit: give a whole number from 1 to {most}, not {text!r}")
    return limit


def _body(request: Any) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying what is wrong with it."""
    raw = request.content.read() if request.content is not None else b""
    return json_object(raw, what="the body")


class Admin:
    """The admin Klein app of one crossbar service."""

    app = Klein()

    def __init__(
        self,
        config: Config,
        clock: IReactorTime,
        table: Table,
        hosts: Hosts,
        limiter: Limiter,
        store: Store,
        metrics: Metrics,
        usage: UsageRecorder,
        reload: Reload,
    ) -> None:
        self.config = config
        self._clock = clock
        self._table = table
        self._hosts = hosts
        self._limiter = limiter
        self._store = store
        self._metrics = metrics
        self._usage = usage
        self._reload = reload
        self._started = clock.seconds()

    def reconfigure(self, config: Config) -> None:
        """The reloaded config: its token, routes and hosts from the next request on."""
        self.config = config

    def now(self) -> float:
        """The clock's time (seconds since the epoch)."""
        return self._clock.seconds()

    def authorize(self, request: Any) -> None:
        """Raise a 401/403 ClientError unless the caller may use the API."""
        admin_auth.check(request, self.config.server.admin_token)

    def resource(self) -> Any:
        """The Klein resource to serve."""
        return self.app.resource()

    # -- leases and routes

    @app.route("/api/leases", methods=["GET"])
    @api
    async def leases(self, request: Any) -> dict[str, Any]:
        """GET /api/leases?route=: the lease snapshot (pins excluded)."""
        now = self.now()
        leases = self._table.snapshot(route=_arg(request, "route"))
        return {"leases": [lease_row(lease, now) for lease in leases]}

    @app.route("/api/routes", methods=["GET"])
    @api
    async def routes(self, request: Any) -> dict[str, Any]:
        """GET /api/routes: configured and seen routes, pins, lease counts, queue shares."""
        limit = _limit(request, MAX_ROUTES, default=100)
        usage = await self._store.usage_totals("route")
        rows = route_rows(self.config, self._table, usage, self._limiter)
        return {"routes": rows[:limit], "total": len(rows)}

    @app.route("/api/routes/<route>/leases", methods=["DELETE"])
    @api
    async def release(self, request: Any, route: str) -> dict[str, Any]:
        """DELETE /api/routes/<route>/leases: drop the route's leases."""
        self._known_route(route)
        released = await self._table.release(route, self.now())
        log.info("admin: released {n} leases of route {route}", n=released, route=route)
        return {"route": route, "released": released}

    @app.route("/api/routes/<route>/pin", methods=["PUT"])
    @api
    async def pin(self, request: Any, route: str) -> dict[str, Any]:
        """PUT /api/routes/<route>/pin {"host": h}: pin to one of the route's hosts."""
        host = _body(request).get("host")
        if not isinstance(host, str) or not host:
            raise bad_request('give the host to pin to as {"host": "<name>"}')
        resolved = self.config.route(route)
        if resolved is None:
            raise not_found(f"no route or template serves {route!r}")
        if host not in resolved.hosts:
            # Only the route's configured host names: a pin never sends a route somewhere its
            # config does not allow.
            raise ClientError(
                409,
                "invalid_request_error",
                f"host {host!r} is not one of route {route!r}'s hosts "
                f"({', '.join(resolved.hosts)}); pin to one of those by name",
            )
        self._table.note_candidates(route, resolved.hosts)
        await self._table.pin(route, host, self.now())
        log.info("admin: route {route} pinned to {host}", route=route, host=host)
        return {"route": route, "pinned": host, "healthy": self._hosts.healthy(host)}

    @app.route("/api/routes/<route>/pin", methods=["DELETE"])
    @api
    async def unpin(self, request: Any, route: str) -> dict[str, Any]:
        """DELETE /api/routes/<route>/pin: remove the pin; the leases stay."""
        self._known_route(route)
        table = self._table
        previous = table.pinned(route)
        await table.unpin(route, self.now())
        if previous is not None:
            log.info("admin: route {route} unpinned from {host}", route=route, host=previous)
        return {"route": route, "unpinned": previous}

    def _known_route(self, route: str) -> None:
        """404 unless the config serves `route` or it still holds leases or a pin."""
        table = self._table
        if (
            self.config.route(route) is None
            and not table.snapshot(route)
            and not table.pinned(route)
        ):
            raise not_found(f"no route or template serves {route!r}, and it holds no leases")

    # -- hosts

    @app.route("/api/hosts", methods=["GET"])
    @api
    async def hosts(self, request: Any) -> dict[str, Any]:
        """GET /api/hosts: health, draining, and slots per model."""
        return {"hosts": host_rows(self._hosts, self._limiter, self._table)}

    @app.route("/api/hosts/<name>/drain", methods=["POST", "DELETE"])
    @api
    async def drain(self, request: Any, name: str) -> dict[str, Any]:
        """POST (drain) or DELETE (undrain) /api/hosts/<name>/drain."""
        hosts = self._hosts
        try:
            if request.method == b"POST":
                await hosts.drain(name)
            else:
                await hosts.undrain(name)
        except NoSuchHost:
            raise not_found(f"no host named {name!r} in the config") from None
        return {"host": name, "draining": hosts.draining(name)}

    # -- history

    @app.route("/api/events", methods=["GET"])
    @api
    async def events(self, request: Any) -> dict[str, Any]:
        """GET /api/events?route=&since=&limit=: lease events, newest first."""
        since = since_arg(_arg(request, "since"), self.now())
        limit = _limit(request, MAX_EVENTS, default=100)
        found = await self._store.list_events(
            route=_arg(request, "route"), since=since, limit=limit
        )
        return {"events": [asdict(e) for e in found]}

    @app.route("/api/usage", methods=["GET"])
    @api
    async def usage(self, request: Any) -> dict[str, Any]:
        """GET /api/usage?by=&since=: totals per route, host or model."""
        by = _arg(request, "by") or "route"
        if by not in USAGE_GROUPS:
            raise bad_request(f"by: must be one of {', '.join(USAGE_GROUPS)}, not {by!r}")
        since = since_arg(_arg(request, "since"), self.now())
        rows = await self._store.usage_totals(by, since)
        for row in rows:
            prompt = row["prompt_tokens"] or 0
            row["cache_hit_ratio"] = (row["cached_tokens"] or 0) / prompt if prompt else None
        return {"by": by, "since": since, "usage": rows}

    @app.route("/api/usage/series", methods=["GET"])
    @api
    async def usage_series(self, request: Any) -> dict[str, Any]:
        """GET /api/usage/series?since=&bucket=: tokens per bucket and route (the chart)."""
        since, bucket = usage_series_args(
            _arg(request, "since"), _arg(request, "bucket"), self.now()
        )
        series = await self._store.usage_series(since, bucket)
        return {"since": since, "bucket": bucket, "now": self.now(), "series": series}

    # -- the service

    @app.route("/api/status", methods=["GET"])
    @api
    async def status(self, request: Any) -> dict[str, Any]:
        """GET /api/status: is the store written (or is crossbar routing from memory)."""
        store = self._table.journal.status()
        store["unsaved_usage_rows"] = len(self._usage.unsaved)
        store["dropped_usage_rows"] = self._usage.dropped
        healthy = sum(1 for h in self._hosts.names() if self._hosts.healthy(h))
        return {
            "status": "degraded" if store["degraded"] else "ok",
            "store": store,
            "hosts": {"configured": len(self._hosts.names()), "healthy": healthy},
            "leases": len(self._table),
            "started": self._started,
            "uptime": self.now() - self._started,
        }

    @app.route("/api/reload", methods=["POST"])
    @api
    async def reload(self, request: Any) -> dict[str, Any]:
        """POST /api/reload: read the config file again; a bad one is refused (400)."""
        try:
            notes = await self._reload()
        except ConfigError as e:
            raise ReloadRefused(e.errors) from None
        return {"reloaded": True, "path": self.config.path, "notes": notes}

    @app.route("/metrics", methods=["GET"])
    async def metrics(self, request: Any) -> bytes:
        """GET /metrics: Prometheus text, behind the same auth as the API."""
        self.authorize(request)
        request.setHeader(b"Content-Type", CONTENT_TYPE_LATEST.encode())
        return self._metrics.render()

    @app.route("/", methods=["GET"])
    async def dashboard(self, request: Any) -> bytes:
        """GET /: the dashboard page (package data, no external assets)."""
        # The page holds no data (it fetches the API with the token it is given), so with a
        # token set anyone may load it; without one, the loopback rule applies as to the API.
        if not self.config.server.admin_token:
            admin_auth.check_local(request)
        page = resources.files("crossbar").joinpath("static/dashboard.html").read_bytes()
        request.setHeader(b"Content-Type", b"text/html; charset=utf-8")
        request.setHeader(b"Cache-Control", b"no-store")
        request.setHeader(b"X-Content-Type-Options", b"nosniff")
        request.setHeader(
            b"Content-Security-Policy",
            b"default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
            b"img-src 'self' data:; frame-ancestors 'none'",
        )
        return page

    # -- errors

    @app.handle_errors(ClientError)
    def _client_error(self, request: Any, failure: Any) -> bytes:
        return self._answer(request, failure.value)

    @app.handle_errors(ReloadRefused)
    def _reload_refused(self, request: Any, failure: Any) -> bytes:
        errors = failure.value.errors
        body = bad_request(
            f"the config file has {len(errors)} error(s); the old config stays: "
            + "; ".join(errors)
        ).payload()
        body["error"]["errors"] = errors
        return _json(request, 400, body)

    @app.handle_errors(StoreUnavailable)
    def _store_unavailable(self, request: Any, failure: Any) -> bytes:
        next_try = self._table.journal.status()["next_try_in"]
        error = unavailable(str(failure.value), retry_after=next_try or 5)
        return self._answer(request, error)

    @app.handle_errors(StoreError)
    def _store_error(self, request: Any, failure: Any) -> bytes:
        log.error("admin: {error}", error=str(failure.value))
        error = unavailable(f"the store cannot be read now: {failure.value}", retry_after=5)
        return self._answer(request, error)

    @app.handle_errors(HTTPException)
    def _routing_error(self, request: Any, failure: Any) -> bytes:
        # No such path or method. A caller who may not use the API learns nothing more.
        try:
            self.authorize(request)
        except ClientError as e:
            return self._answer(request, e)
        e = failure.value
        if isinstance(e, MethodNotAllowed) and e.valid_methods:
            request.setHeader(b"Allow", ", ".join(e.valid_methods).encode())
            method = request.method.decode("ascii", "replace")
            error = ClientError(405, "invalid_request_error", f"{method} is not allowed here")
        elif e.code == 404:
            error = not_found(f"the admin API has no {request.path.decode('utf-8', 'replace')}")
        else:
            error = ClientError(e.code, "invalid_request_error", e.description or e.name)
        return self._answer(request, error)

    @app.handle_errors(Exception)
    def _crashed(self, request: Any, failure: Any) -> bytes:
        log.failure("admin request {path} failed", failure, path=request.path)
        return self._answer(request, _INTERNAL)

    def _answer(self, request: Any, error: ClientError) -> bytes:
        """Write `error` as crossbar's JSON error body."""
        request.setResponseCode(error.status)
        request.setHeader(b"Content-Type", b"application/json")
        for name, value in error.headers.items():
            request.setHeader(name.encode(), value.encode())
        return error.body()
