"""The admin API, /metrics and the dashboard: one Klein class on `server.admin_listen`
(docs/operator-guide.md, "Admin API").

JSON in and out; every error is crossbar's OpenAI-style body. It is given the parts it reads
and steers (`AdminParts`) and the service's `reload`; a reload hands it the new config. Each
route reads or calls what it names: the answers' shapes are views.py's, facts.py's and
pages.py's, batches' batches.py's, the operator's actions actions.py's; who may call it: auth.py.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from functools import partial
from importlib import resources
from typing import Any

from attrs import asdict, frozen
from klein import Klein
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from crossbar.admin import auth as admin_auth
from crossbar.admin import keys as admin_keys
from crossbar.admin.actions import Actions, Reload, ReloadRefused
from crossbar.admin.batches import MAX_BATCH_EVENTS, MAX_BATCHES, BatchViews
from crossbar.admin.facts import route_facts
from crossbar.admin.http import (
    MAX_BODY,
    arg,
    body_of,
    duration_option,
    flag_option,
    json_answer,
    limit_arg,
    options_of,
)
from crossbar.admin.metrics import CONTENT_TYPE_LATEST, Metrics
from crossbar.admin.pages import ROUTE_SORTS, LeaseFilter, lease_page, route_page
from crossbar.admin.views import (
    USAGE_SORTS,
    host_rows,
    lease_row,
    route_rows,
    since_arg,
    top_usage,
    usage_series_args,
)
from crossbar.batches import BatchRunner
from crossbar.cluster import Instances
from crossbar.config import Config
from crossbar.handoff import Evacuator, HandoffStore
from crossbar.hosts import Hosts
from crossbar.leases import Journal, StoreUnavailable, Table, Warmth
from crossbar.limiter import Limiter
from crossbar.proxy import UsageRecorder
from crossbar.store import USAGE_GROUPS, Store, StoreError
from crossbar.tenants import KeyActionRefused, Tenants
from crossbar.wire import ClientError, bad_request, not_found, phrase, unavailable

__all__ = ["MAX_BODY", "Admin"]

log = Logger(namespace="crossbar.admin")
MAX_EVENTS = 1000
MAX_ROUTES = 1000
MAX_PAGE = 1000  # leases in one answer
_INTERNAL = ClientError(500, "api_error", "the admin API failed on this request; see the log")


def dashboard_page() -> bytes:
    """The dashboard: its markup with its script inlined (two files to read and edit, one
    answer with no external asset, as the page's Content-Security-Policy wants)."""
    static = resources.files("crossbar.admin").joinpath("static")
    page = static.joinpath("dashboard.html").read_text("utf-8")
    script = static.joinpath("dashboard.js").read_text("utf-8")
    marker = "<script>/* dashboard.js"
    head, _, rest = page.partition(marker)
    return (head + "<script>\n" + script + rest[rest.index("</script>") :]).encode()


@frozen
class AdminParts:
    """What the admin API reads and steers, given by the composition (app/wiring.py)."""

    clock: IReactorTime
    table: Table
    journal: Journal
    hosts: Hosts
    limiter: Limiter
    store: Store
    metrics: Metrics
    usage: UsageRecorder
    instances: Instances
    warmth: Warmth
    evacuator: Evacuator | None = None
    kept: HandoffStore | None = None  # the hand-off store (its state in /api/status)
    tenants: Tenants | None = None  # the named client keys
    batches: BatchRunner | None = None  # this instance's batch items


Handler = Callable[..., Awaitable[Any]]


def api(fn: Handler) -> Handler:
    """Authorize, run the handler, answer its result as JSON (200)."""

    @functools.wraps(fn)
    async def handler(self: Admin, request: Any, **kwargs: Any) -> bytes:
        self.authorize(request)
        return json_answer(request, 200, await fn(self, request, **kwargs))

    return handler


class Admin:
    """The admin Klein app of one crossbar service: what it shows, what it steers, its errors."""

    app = Klein()

    def __init__(self, config: Config, parts: AdminParts, reload: Reload) -> None:
        self.config = config
        self._parts = p = parts
        self._clock, self._table, self._hosts = p.clock, p.table, p.hosts
        self._limiter, self._store, self._evacuator = p.limiter, p.store, p.evacuator
        self._actions = Actions(p.clock, p.table, p.hosts, reload, p.evacuator)
        self._batches = BatchViews(p.clock, p.store)
        self._started = p.clock.seconds()

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
        """GET /api/leases?route=&host=&model=&fp=&limit=&cursor=: a page of the lease table
        (pins excluded) in key order, how many match, and the next page's cursor."""
        where = LeaseFilter(*(arg(request, name) for name in ("route", "host", "model", "fp")))
        limit = limit_arg(request, MAX_PAGE, default=100)
        page = await lease_page(self._table, self._clock, where, arg(request, "cursor"), limit)
        now = self.now()
        rows = [lease_row(lease, now) for lease in page.rows]
        return {"leases": rows, "total": page.total, "next": page.next}

    @app.route("/api/routes", methods=["GET"])
    @api
    async def routes(self, request: Any) -> dict[str, Any]:
        """GET /api/routes?route=&host=&model=&sort=&since=&limit=&cursor=: configured and
        seen routes, pins, lease counts, queue shares and requests since `since` (24 h)."""
        limit = limit_arg(request, MAX_ROUTES, default=100)
        sort = arg(request, "sort") or "name"
        if sort not in ROUTE_SORTS:
            raise bad_request(f"sort: must be one of {', '.join(ROUTE_SORTS)}, not {sort!r}")
        since = since_arg(arg(request, "since"), self.now(), default=self.now() - 86400)
        await self._parts.usage.flush()
        usage = await self._store.usage_totals("route", since, percentiles=False)
        facts = route_facts(self.config, self._table, usage, self._limiter)
        where = (arg(request, name) for name in ("route", "host", "model"))
        page = route_page(self.config, facts, *where, sort, arg(request, "cursor"), limit)
        rows = route_rows(self.config, facts, page.rows)
        return {"routes": rows, "total": page.total, "next": page.next, "since": since}

    @app.route("/api/hosts", methods=["GET"])
    @api
    async def hosts(self, request: Any) -> dict[str, Any]:
        """GET /api/hosts: health, draining, and slots per model."""
        rows = host_rows(self._hosts, self._limiter, self._table, self._parts.warmth)
        evacuator = self._evacuator
        for row in rows:  # the latest evacuation of each host, while it runs and after
            evacuation = None if evacuator is None else evacuator.evacuations.get(row["name"])
            row["evacuation"] = None if evacuation is None else evacuation.view()
            # When a drain's grace stops the host's running answers (None: no grace pending).
            row["drain_grace_ends"] = (
                None if evacuator is None else evacuator.grace_ends(row["name"])
            )
        return {"hosts": rows}

    # -- the operator's actions

    @app.route("/api/routes/<route>/leases", methods=["DELETE"])
    @api
    async def release(self, request: Any, route: str) -> dict[str, Any]:
        """DELETE /api/routes/<route>/leases: drop the route's leases."""
        return await self._actions.release(self.config, route)

    @app.route("/api/routes/<route>/pin", methods=["PUT"])
    @api
    async def pin(self, request: Any, route: str) -> dict[str, Any]:
        """PUT /api/routes/<route>/pin {"host": h}: pin to one of the route's hosts."""
        return await self._actions.pin(self.config, route, body_of(request))

    @app.route("/api/routes/<route>/pin", methods=["DELETE"])
    @api
    async def unpin(self, request: Any, route: str) -> dict[str, Any]:
        """DELETE /api/routes/<route>/pin: remove the pin; the leases stay."""
        return await self._actions.unpin(self.config, route)

    @app.route("/api/hosts/<name>/drain", methods=["POST", "DELETE"])
    @api
    async def drain(self, request: Any, name: str) -> dict[str, Any]:
        """POST (drain) or DELETE (undrain) /api/hosts/<name>/drain; a drain's `grace`
        ({"grace": "30s"} or `?grace=30s`): its running streams move elsewhere when it ends."""
        if request.method != b"POST":
            return await self._actions.drain(name, draining=False)
        options = options_of(request)
        given = options.get("grace", arg(request, "grace"))
        grace = None if given is None else duration_option(given, "grace")
        return await self._actions.drain(name, draining=True, grace=grace)

    @app.route("/api/hosts/<name>/evacuate", methods=["POST"])
    @api
    async def evacuate(self, request: Any, name: str) -> dict[str, Any]:
        """POST /api/hosts/<name>/evacuate: drain the host and move its conversations away,
        each prewarmed on its new host, and with `now` ({"now": true} or `?now=1`) its
        running streams too; the answer (and GET /api/hosts) shows the progress."""
        now = flag_option(request, options_of(request), "now")
        return await self._actions.evacuate(name, now=now)

    @app.route("/api/hosts/<name>/models/<model>/load", methods=["POST"])
    @api
    async def load_model(self, request: Any, name: str, model: str) -> dict[str, Any]:
        """POST /api/hosts/<name>/models/<model>/load: the router loads the model."""
        return await self._actions.model(name, model, load=True)

    @app.route("/api/hosts/<name>/models/<model>/unload", methods=["POST"])
    @api
    async def unload_model(self, request: Any, name: str, model: str) -> dict[str, Any]:
        """POST /api/hosts/<name>/models/<model>/unload: the router unloads the model."""
        return await self._actions.model(name, model, load=False)

    @app.route("/api/models/events", methods=["GET"])
    @api
    async def model_events(self, request: Any) -> dict[str, Any]:
        """GET /api/models/events: the latest model loads and unloads seen or caused, newest
        first (`host`, `model` to filter; `limit`, default 100)."""
        host, model = arg(request, "host"), arg(request, "model")
        limit = limit_arg(request, MAX_EVENTS, default=100)
        found = [
            e.as_dict()
            for e in reversed(self._hosts.model_events)
            if (not host or e.host == host) and (not model or e.model == model)
        ]
        return {"events": found[:limit]}

    @app.route("/api/reload", methods=["POST"])
    @api
    async def reload(self, request: Any) -> dict[str, Any]:
        """POST /api/reload: read the config file again; a bad one is refused (400)."""
        return await self._actions.reload(self.config)

    # -- client keys

    def _keys(self) -> Tenants:
        if self._parts.tenants is None:
            raise not_found("this crossbar keeps no client keys")
        return self._parts.tenants

    @app.route("/api/keys", methods=["GET"])
    @api
    async def list_keys(self, request: Any) -> dict[str, Any]:
        """GET /api/keys?names=: every named key (or those of the comma-separated `names`),
        its limits and use (never a secret)."""
        names = arg(request, "names")
        wanted = None if names is None else [n for n in names.split(",") if n]
        return {"keys": self._keys().list(wanted)}

    @app.route("/api/keys", methods=["POST"])
    async def create_key(self, request: Any) -> bytes:
        """POST /api/keys {"name", "routes", ...}: a new key; 201 with its secret, once."""
        self.authorize(request)
        made = await admin_keys.create(self._keys(), body_of(request), self.now())
        return json_answer(request, 201, made)

    @app.route("/api/keys/<name>", methods=["GET"])
    @api
    async def show_key(self, request: Any, name: str) -> dict[str, Any]:
        """GET /api/keys/<name>: the key, its limits, what it used this minute, day, month."""
        try:
            return self._keys().show(name)
        except KeyActionRefused as e:
            raise admin_keys.refused(e) from None

    @app.route("/api/keys/<name>", methods=["DELETE"])
    @api
    async def delete_key(self, request: Any, name: str) -> dict[str, Any]:
        """DELETE /api/keys/<name>: the key no longer exists (on every instance)."""
        try:
            await self._keys().delete(name)
        except KeyActionRefused as e:
            raise admin_keys.refused(e) from None
        return {"key": name, "deleted": True}

    @app.route("/api/keys/<name>/block", methods=["POST", "DELETE"])
    @api
    async def block_key(self, request: Any, name: str) -> dict[str, Any]:
        """POST (block) or DELETE (unblock) /api/keys/<name>/block."""
        try:
            key = await self._keys().block(name, blocked=request.method == b"POST")
        except KeyActionRefused as e:
            raise admin_keys.refused(e) from None
        return {"key": name, "blocked": key.blocked}

    @app.route("/api/keys/<name>/rotate", methods=["POST"])
    @api
    async def rotate_key(self, request: Any, name: str) -> dict[str, Any]:
        """POST /api/keys/<name>/rotate {"grace": "1h"}: a new secret (in the answer, once);
        the old one stays valid for `grace`."""
        return await admin_keys.rotate(self._keys(), name, body_of(request), self.now())

    # -- batches (batches.py)

    @app.route("/api/batches", methods=["GET"])
    @api
    async def batches(self, request: Any) -> dict[str, Any]:
        """GET /api/batches?route=&key=&status=&after=&limit=: every route's and key's batches,
        newest first, with progress, tokens and ETA; `next` is the next page's `after`."""
        where = (arg(request, name) for name in ("route", "key", "status", "after"))
        limit = limit_arg(request, MAX_BATCHES, default=100)
        return await self._batches.page(*where, limit)

    @app.route("/api/batches/<batch_id>", methods=["GET"])
    @api
    async def batch(self, request: Any, batch_id: str) -> dict[str, Any]:
        """GET /api/batches/<id>?limit=: the batch and its latest events, newest first."""
        limit = limit_arg(request, MAX_BATCH_EVENTS, default=100)
        return await self._batches.show(batch_id, limit)

    @app.route("/api/batches/<batch_id>/cancel", methods=["POST"])
    @api
    async def cancel_batch(self, request: Any, batch_id: str) -> dict[str, Any]:
        """POST /api/batches/<id>/cancel: cancel it as its client would; the batch after."""
        return await self._batches.cancel(batch_id)

    # -- history

    @app.route("/api/events", methods=["GET"])
    @api
    async def events(self, request: Any) -> dict[str, Any]:
        """GET /api/events?route=&since=&limit=: lease events, newest first."""
        since = since_arg(arg(request, "since"), self.now())
        limit = limit_arg(request, MAX_EVENTS, default=100)
        found = await self._store.list_events(route=arg(request, "route"), since=since, limit=limit)
        return {"events": [asdict(e) for e in found]}

    @app.route("/api/usage", methods=["GET"])
    @api
    async def usage(self, request: Any) -> dict[str, Any]:
        """GET /api/usage?by=&since=&sort=&limit=: totals per route, host or model; `sort`
        requests or errors (most first) or cache_hit_ratio (worst first), `limit` the top."""
        by = arg(request, "by") or "route"
        if by not in USAGE_GROUPS:
            raise bad_request(f"by: must be one of {', '.join(USAGE_GROUPS)}, not {by!r}")
        sort = arg(request, "sort") or by
        if sort not in (by, *USAGE_SORTS):
            raise bad_request(f"sort: must be one of {by}, {', '.join(USAGE_SORTS)}, not {sort!r}")
        limit = limit_arg(request, MAX_ROUTES, default=1) if arg(request, "limit") else None
        since = since_arg(arg(request, "since"), self.now())
        await self._parts.usage.flush()  # the requests that have finished, all of them
        rows = await self._store.usage_totals(
            by, since, pick=partial(top_usage, sort=sort, limit=limit)
        )
        return {"by": by, "since": since, "usage": rows}

    @app.route("/api/moves", methods=["GET"])
    @api
    async def moves(self, request: Any) -> dict[str, Any]:
        """GET /api/moves?since=&limit=: the conversations moved between hosts most often."""
        since = since_arg(arg(request, "since"), self.now(), default=self.now() - 86400)
        limit = limit_arg(request, MAX_EVENTS, default=10)
        assert since is not None
        return {"since": since, "moves": await self._store.top_moves(since, limit)}

    @app.route("/api/usage/series", methods=["GET"])
    @api
    async def usage_series(self, request: Any) -> dict[str, Any]:
        """GET /api/usage/series?since=&bucket=&top=: tokens per bucket and route (the chart);
        with `top`, that many routes and the rest as "(other)"."""
        since, bucket = usage_series_args(arg(request, "since"), arg(request, "bucket"), self.now())
        top = limit_arg(request, MAX_ROUTES, default=1, name="top") if arg(request, "top") else None
        await self._parts.usage.flush()
        series = await self._store.usage_series(since, bucket, top)
        return {"since": since, "bucket": bucket, "now": self.now(), "series": series}

    # -- the service

    @app.route("/api/status", methods=["GET"])
    @api
    async def status(self, request: Any) -> dict[str, Any]:
        """GET /api/status: is the store written (or is crossbar routing from memory)."""
        store = self._parts.journal.status()
        usage = self._parts.usage
        store["unsaved_usage_rows"] = len(usage.unsaved)
        # Dropped: beyond what an outage keeps ("outage"), or no column could hold them.
        reasons = {"outage": usage.dropped, **self._store.dropped_rows}
        store["dropped_usage_rows"] = sum(reasons.values())
        store["dropped_usage_reasons"] = {why: n for why, n in reasons.items() if n}
        healthy = sum(1 for h in self._hosts.names() if self._hosts.healthy(h))
        kept = self._parts.kept
        handoff = {"enabled": kept is not None and kept.enabled}
        if kept is not None and kept.enabled:
            handoff.update(kept.stats(), directory=kept.directory)
        degraded = store["degraded"] or bool(handoff.get("error"))
        return {
            "status": "degraded" if degraded else "ok",
            "store": store,
            "handoff_store": handoff,
            "hosts": {"configured": len(self._hosts.names()), "healthy": healthy},
            "leases": len(self._table),
            "started": self._started,
            "uptime": self.now() - self._started,
        }

    @app.route("/api/instances", methods=["GET"])
    @api
    async def instances(self, request: Any) -> dict[str, Any]:
        """GET /api/instances: the crossbar instances sharing this one's store."""
        instances = self._parts.instances
        return {"this": instances.id, "instances": instances.status()}

    @app.route("/metrics", methods=["GET"])
    async def metrics(self, request: Any) -> bytes:
        """GET /metrics: Prometheus text, behind the same auth as the API."""
        self.authorize(request)
        request.setHeader(b"Content-Type", CONTENT_TYPE_LATEST.encode())
        return self._parts.metrics.render()

    @app.route("/", methods=["GET"])
    async def dashboard(self, request: Any) -> bytes:
        """GET /: the dashboard page (package data, no external assets)."""
        # The page holds no data (it fetches the API with the token it is given), so with a
        # token set anyone may load it; without one, the loopback rule applies as to the API.
        if not self.config.server.admin_token:
            admin_auth.check_local(request)
        page = dashboard_page()
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
        return json_answer(request, 400, body)

    @app.handle_errors(StoreUnavailable)
    def _store_unavailable(self, request: Any, failure: Any) -> bytes:
        next_try = self._parts.journal.status()["next_try_in"]
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
        request.setResponseCode(error.status, phrase(error.status))
        request.setHeader(b"Content-Type", b"application/json")
        for name, value in error.headers.items():
            request.setHeader(name.encode(), value.encode())
        return error.body()
