"""The admin API's plumbing: its Klein app, the JSON answer of a handler, query arguments, and
the parts every handler may read (SPEC §10). The handlers: admin.py and admin_actions.py."""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any

from klein import Klein
from twisted.internet.interfaces import IReactorTime

from crossbar.admin import auth as admin_auth
from crossbar.admin.metrics import Metrics
from crossbar.cluster.instances import Instances
from crossbar.config.values import Config
from crossbar.handoff.evacuate import Evacuator
from crossbar.hosts.registry import Hosts
from crossbar.leases.table import Table
from crossbar.leases.warmth import Warmth
from crossbar.limiter.slots import Limiter
from crossbar.proxy.usage import UsageRecorder
from crossbar.store.database import Store
from crossbar.wire.errors import bad_request, phrase
from crossbar.wire.inbound import json_object

MAX_BODY = 64 * 1024  # admin requests are small JSON objects
Handler = Callable[..., Awaitable[Any]]
Reload = Callable[[], Awaitable[list[str]]]
app = Klein()  # every admin route, on whichever module declares it


def api(fn: Handler) -> Handler:
    """Authorize, run the handler, answer its result as JSON (200)."""

    @functools.wraps(fn)
    async def handler(self: AdminBase, request: Any, **kwargs: Any) -> bytes:
        self.authorize(request)
        return json_answer(request, 200, await fn(self, request, **kwargs))

    return handler


def json_answer(request: Any, status: int, payload: Any) -> bytes:
    request.setResponseCode(status, phrase(status))
    request.setHeader(b"Content-Type", b"application/json")
    request.setHeader(b"Cache-Control", b"no-store")
    return json.dumps(payload).encode()


def arg(request: Any, name: str) -> str | None:
    """A query argument; None when it is missing or empty (`?route=` filters nothing)."""
    values = request.args.get(name.encode())
    return values[0].decode("utf-8", "replace") or None if values else None


def limit_arg(request: Any, most: int, default: int, name: str = "limit") -> int:
    """The `limit` (or `name`) query argument: a whole number from 1 to `most`, or a 400."""
    text = arg(request, name) or str(default)
    try:
        limit = int(text)
    except ValueError:
        limit = -1
    if not 0 < limit <= most:
        raise bad_request(f"{name}: give a whole number from 1 to {most}, not {text!r}")
    return limit


def body_of(request: Any) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying what is wrong with it."""
    raw = request.content.read() if request.content is not None else b""
    return json_object(raw, what="the body")


class AdminBase:
    """What every admin handler reads and steers, given by the service."""

    app = app

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
        instances: Instances,
        reload: Reload,
        evacuator: Evacuator | None = None,
        warmth: Warmth | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self._table = table
        self._hosts = hosts
        self._limiter = limiter
        self._store = store
        self._metrics = metrics
        self._usage = usage
        self._instances = instances
        self._reload = reload
        self._evacuator = evacuator
        self._warmth = warmth
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
