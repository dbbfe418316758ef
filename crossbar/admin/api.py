"""The admin API, /metrics and the dashboard (SPEC §10): a Klein app on `server.admin_listen`.

JSON in and out; every error is crossbar's OpenAI-style body. It is given the parts it reads
and steers (admin_http.py) and the service's `reload`; a reload hands it the new config. The
operator's actions are admin_actions.py's; who may call it: `crossbar.admin_auth`.
"""

from __future__ import annotations

from functools import partial
from importlib import resources
from typing import Any

from attrs import asdict
from twisted.logger import Logger
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from crossbar.admin import auth as admin_auth
from crossbar.admin.actions import AdminActions, ReloadRefused
from crossbar.admin.facts import route_facts
from crossbar.admin.http import MAX_BODY, api, app, arg, json_answer, limit_arg
from crossbar.admin.metrics import CONTENT_TYPE_LATEST
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
from crossbar.leases.journal import StoreUnavailable
from crossbar.store.database import USAGE_GROUPS, StoreError
from crossbar.wire.errors import ClientError, bad_request, not_found, phrase, unavailable

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


class Admin(AdminActions):
    """The admin Klein app of one crossbar service: what it shows, and its errors."""

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
        rows = host_rows(self._hosts, self._limiter, self._table, self._warmth)
        if self._evacuator is not None:
            for row in rows:  # the latest evacuation of each host, while it runs and after
                evacuation = self._evacuator.evacuations.get(row["name"])
                row["evacuation"] = None if evacuation is None else evacuation.view()
        return {"hosts": rows}

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
        series = await self._store.usage_series(since, bucket, top)
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

    @app.route("/api/instances", methods=["GET"])
    @api
    async def instances(self, request: Any) -> dict[str, Any]:
        """GET /api/instances: the crossbar instances sharing this one's store."""
        return {"this": self._instances.id, "instances": self._instances.status()}

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
        request.setResponseCode(error.status, phrase(error.status))
        request.setHeader(b"Content-Type", b"application/json")
        for name, value in error.headers.items():
            request.setHeader(name.encode(), value.encode())
        return error.body()
