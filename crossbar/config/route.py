"""Routes and templates: the named entry points of clients, and how they are read."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from attrs import evolve, field, frozen

from crossbar.config.classes import STANDARD, class_error
from crossbar.config.fields import NAME, Errors, Section, key_path, origin_error, quote
from crossbar.config.limits import PRIORITY_MAX, PRIORITY_MIN, WEIGHT_MAX, WEIGHT_MIN, RouteLimits

AFFINITIES = ("conversation", "route")
AUTHS = ("", "keys")  # "": the route's own `keys` list, if any; "keys": named keys too
UNKNOWN_MODELS = ("error", "default")
# A turn that waited this long behind a running batch request stops it (measured: the agents'
# TTFT p99 beside a batch flood as low as theirs alone; docs/performance.md, "Request classes").
BATCH_YIELD_AFTER = 0.2
# The keys that shape a route's place in the slot queues; meaningless where it never queues.
SHARING_KEYS = (
    "priority",
    "weight",
    "max_in_flight",
    "max_queued",
    "batch_slots",
    "batch_yield_after",
)
# The valve weighs a queued turn's wait at home against a move: only a queueing route with a
# lease per conversation has either (docs/reference.md, "Leases": the valve).
VALVE_KEYS = ("valve", "valve_margin", "valve_slack", "valve_hold")
VALVE_MARGIN_MAX = 100.0
RESUME_MAX = 8  # resume_attempts at most: each one is a host the answer may take down


@frozen
class Route:
    """A resolved route: where its requests may go and how they are leased and queued."""

    name: str
    hosts: tuple[str, ...]
    default_model: str = ""
    affinity: str = "conversation"
    queue: bool = True
    peers: tuple[str, ...] = ()
    keys: tuple[str, ...] = field(default=(), repr=False)
    auth: str = ""  # "keys": only named keys whose routes cover it (and its own `keys`)
    # (glob, model) in file order: a client's model name matching the glob means that model.
    aliases: tuple[tuple[str, str], ...] = ()
    unknown_model: str = "error"  # or "default": serve default_model for any other name
    cors_origins: tuple[str, ...] = ()  # browser origins that may call it ("*": any); () off
    template: str | None = None  # the template that served it, None for a concrete route
    priority: int = 0
    weight: float | None = None  # None: the shared FIFO line of its priority
    max_in_flight: int | None = None  # None: unlimited
    max_queued: int | None = None  # None: the server's queue_max
    # Its requests' class when neither they nor their key say (config/classes.py), and the
    # slots of a (host, model) its batch requests may hold (None: all but one, at least 1).
    request_class: str = STANDARD
    batch_slots: int | None = None
    # A batch request of the route, not streamed and not yet answered, is stopped (and sent
    # again, first among batch) when a turn (interactive or standard) has waited this long
    # behind it on its host; None: never (`false`).
    batch_yield_after: float | None = BATCH_YIELD_AFTER
    rebalance: bool = False  # move idle conversations off a host whose queue stays full
    rebalance_after: float = 30.0  # how long a queue must stay non-empty
    rebalance_idle: float = 20.0  # only conversations idle this long move
    rebalance_per_minute: int = 10  # moves per minute at most, for the route
    # Output tokens a request gets when it sets no limit, and the most any gets (None: off).
    max_tokens_default: int | None = None
    max_tokens_cap: int | None = None
    # Message contents on its spans ([tracing]); off: prompts and answers stay out of traces.
    record_content: bool = False
    # The valve: a queued turn moves when its wait at home exceeds its wait and re-prefill on
    # another host x valve_margin + valve_slack; a conversation it moved stays valve_hold.
    valve: bool = True
    valve_margin: float = 1.0
    valve_slack: float = 0.25
    valve_hold: float = 60.0
    # Routes a request falls back to, in order, when this one cannot serve it before its first
    # byte; with `fallback_after`, also when its wait for a slot passes that (None: only when
    # it is refused, or its host is down or refuses it).
    fallbacks: tuple[str, ...] = ()
    fallback_after: float | None = None
    # Times an answer whose host failed may move to another host and go on there: a cut
    # stream continued, an answer that showed nothing run again (0: never; proxy/resume.py).
    resume_attempts: int = 1

    @property
    def limits_output(self) -> bool:
        """Whether the route sets its requests' output limits (max_tokens_default/_cap)."""
        return self.max_tokens_default is not None or self.max_tokens_cap is not None

    @property
    def needs_key(self) -> bool:
        """Whether a request must bring a key: `auth = "keys"`, or a `keys` list."""
        return self.auth == "keys" or bool(self.keys)

    def per_route(self) -> bool:
        """True for affinity = "route": every request of the route shares one lease per model."""
        return self.affinity == "route"

    def queues(self) -> bool:
        """True unless queue = false: requests wait in (and can be refused by) the limiter."""
        return self.queue

    def valves(self) -> bool:
        """Whether a queued turn of the route may move to a host where it would start sooner:
        `valve` on a queueing route with a lease per conversation."""
        return self.valve and self.queue and self.affinity == "conversation"

    @property
    def limits(self) -> RouteLimits:
        """The route's share of the slot queues, as the limiter takes it."""
        return RouteLimits(
            name=self.name,
            priority=self.priority,
            weight=self.weight,
            max_in_flight=self.max_in_flight,
            max_queued=self.max_queued,
            batch_slots=self.batch_slots,
        )

    def alias(self, name: str) -> str | None:
        """The model the first alias glob matching `name` names (file order), or None."""
        for glob, model in self.aliases:
            if fnmatchcase(name, glob):
                return model
        return None


@frozen
class Template:
    """Serves every route name matching `match` (a shell-style glob) with `route`'s keys."""

    name: str
    match: str
    route: Route

    def serves(self, name: str) -> bool:
        return fnmatchcase(name, self.match)

    def resolve(self, name: str) -> Route:
        return evolve(self.route, name=name, template=self.name)


def valid_route_name(name: str) -> bool:
    """Route names are `[a-z0-9][a-z0-9._-]{0,63}`."""
    return NAME.fullmatch(name) is not None


def read_route_body(table: Section, name: str) -> Route:
    """Read the keys every route and template share."""
    missing = not table.has("hosts")
    hosts = table.string_list("hosts", None)  # None: missing or already reported
    if missing:
        table.errors.add(table.sub("hosts"), "missing (the candidate hosts, in preference order)")
    elif hosts == ():
        table.errors.add(table.sub("hosts"), "must name at least one host")
    affinity = table.string("affinity", "conversation")
    if affinity not in AFFINITIES:
        table.errors.add(table.sub("affinity"), 'must be "conversation" or "route"')
        affinity = "conversation"
    unknown_model = table.string("unknown_model", "error")
    if unknown_model not in UNKNOWN_MODELS:
        table.errors.add(
            table.sub("unknown_model"),
            f'must be "error" (404 model_not_found) or "default" (serve default_model), '
            f"not {quote(unknown_model)}",
        )
        unknown_model = "error"
    auth = table.string("auth", "")
    if auth not in AUTHS:
        table.errors.add(
            table.sub("auth"), f'must be "keys" (named client keys), not {quote(auth)}'
        )
        auth = ""
    queue = table.boolean("queue", True)
    request_class = table.string("class", STANDARD)
    if class_error(request_class):
        table.errors.add(table.sub("class"), class_error(request_class) or "")
        request_class = STANDARD
    unqueued = [key for key in SHARING_KEYS if table.has(key)] if not queue else []
    # Tuning a valve that can never open is a mistake worth saying; `valve = false` never is.
    inert = (not queue or affinity == "route") and table.peek("valve") is not False
    valve_unused = [k for k in VALVE_KEYS if table.has(k)] if inert else []
    route = Route(
        name=name,
        hosts=hosts or (),
        default_model=table.string("default_model"),
        affinity=affinity,
        queue=queue,
        peers=table.string_list("peers"),
        keys=table.string_list("keys"),
        auth=auth,
        priority=table.integer("priority", 0, minimum=PRIORITY_MIN, maximum=PRIORITY_MAX),
        weight=table.positive_number("weight", None, WEIGHT_MIN, WEIGHT_MAX),
        max_in_flight=table.integer("max_in_flight", None),
        max_queued=table.integer("max_queued", None, minimum=0),
        request_class=request_class,
        batch_slots=table.integer("batch_slots", None, minimum=1),
        batch_yield_after=table.duration_or_off("batch_yield_after", BATCH_YIELD_AFTER),
        aliases=table.string_table("aliases"),
        unknown_model=unknown_model,
        cors_origins=_read_origins(table),
        rebalance=table.boolean("rebalance", False),
        rebalance_after=table.duration("rebalance_after", 30.0),
        rebalance_idle=table.duration("rebalance_idle", 20.0),
        rebalance_per_minute=table.integer("rebalance_per_minute", 10),
        max_tokens_default=table.integer("max_tokens_default", None),
        max_tokens_cap=table.integer("max_tokens_cap", None),
        record_content=table.boolean("record_content", False),
        valve=table.boolean("valve", True),
        valve_margin=table.positive_number("valve_margin", 1.0, 1.0, VALVE_MARGIN_MAX),
        valve_slack=table.duration("valve_slack", 0.25, positive=False),
        valve_hold=table.duration("valve_hold", 60.0, positive=False),
        fallbacks=table.string_list("fallbacks"),
        fallback_after=table.duration("fallback_after", None),  # type: ignore[arg-type]
        resume_attempts=table.integer("resume_attempts", 1, minimum=0, maximum=RESUME_MAX),
    )
    if route.fallback_after is not None and not route.fallbacks:
        table.errors.add(
            table.sub("fallback_after"), "needs fallbacks (the routes to fall back to)"
        )
    cap, default = route.max_tokens_cap, route.max_tokens_default
    if cap is not None and default is not None and default > cap:
        table.errors.add(
            table.sub("max_tokens_default"),
            f"must be at most max_tokens_cap ({cap}), not {default}",
        )
    for key in unqueued:
        table.errors.add(table.sub(key), "needs queue = true")
    for key in valve_unused:
        need = "queue = true" if not queue else 'affinity = "conversation"'
        table.errors.add(table.sub(key), f"needs {need} (the valve moves queued conversations)")
    return route


def _read_origins(table: Section) -> tuple[str, ...]:
    good = []
    for i, origin in enumerate(table.string_list("cors_origins")):
        origin = origin if origin == "*" else origin.removesuffix("/")  # as browsers send it
        why = origin_error(origin)
        if why is not None:
            table.errors.add(f"{table.sub('cors_origins')}[{i}]", why)
        else:
            good.append(origin)
    if "*" in good and len(good) > 1:
        table.errors.add(table.sub("cors_origins"), '"*" allows every origin: list it alone')
    return tuple(good)


def read_routes(errors: Errors, data: Any) -> dict[str, Route]:
    """Read `[routes.*]`."""
    routes: dict[str, Route] = {}
    outer = Section(errors, "routes", data)
    for name in outer.keys():
        path = outer.sub(name)
        table = Section(errors, path, outer.raw(name))
        if not valid_route_name(name):
            errors.add(path, f"bad route name {quote(name)} (use [a-z0-9][a-z0-9._-]{{0,63}})")
        routes[name] = read_route_body(table, name)
        table.finish()
    return routes


def read_templates(errors: Errors, data: Any) -> list[Template]:
    """Read `[templates.*]` in file order (the first matching template wins)."""
    templates: list[Template] = []
    outer = Section(errors, "templates", data)
    for name in outer.keys():
        path = outer.sub(name)
        table = Section(errors, path, outer.raw(name))
        if not table.has("match"):
            errors.add(table.sub("match"), 'missing (a shell-style glob such as "proj-*")')
        match = table.string("match")
        route = read_route_body(table, "")
        table.finish()
        templates.append(Template(name=name, match=match, route=route))
    return templates


def fallback_loop(start: Route, resolve: Any) -> list[str] | None:
    """The names of a loop of fallbacks through `start` (`start` first and last), or None.
    `resolve(name)` is the route a name serves (a template's included), or None. A request
    follows only its own route's fallbacks, never theirs; a loop is refused all the same: an
    operator who wrote one meant a chain, which crossbar does not follow."""
    path = [start.name]

    def visit(route: Route) -> list[str] | None:
        for name in route.fallbacks:
            if name == start.name:
                return [*path, name]
            if name in path:
                continue  # a loop that does not pass `start`: reported from its own routes
            target = resolve(name)
            if target is None:
                continue
            path.append(name)
            found = visit(target)
            path.pop()
            if found is not None:
                return found
        return None

    return visit(start)


def check_route_links(
    errors: Errors,
    path: str,
    route: Route,
    host_models: dict[str, set[str] | None],
    route_exists: Any,
) -> None:
    """Check a route's references: hosts, default model, aliases, peers. A host whose models
    are discovered (None in `host_models`) may serve anything: names it could serve pass."""
    for host in route.hosts:
        if host not in host_models:
            errors.add(f"{path}.hosts", f"unknown host {quote(host)}")
    if len(set(route.hosts)) != len(route.hosts):
        errors.add(f"{path}.hosts", "names a host twice")
    known = [host_models[h] for h in route.hosts if h in host_models]
    served: set[str] = set().union(*(m for m in known if m is not None))
    discovered = any(m is None for m in known)

    def unserved(model: str) -> bool:
        return bool(served) and not discovered and model not in served

    if route.default_model and unserved(route.default_model):
        errors.add(
            f"{path}.default_model",
            f"{quote(route.default_model)} is served by none of the route's hosts",
        )
    for glob, model in route.aliases:
        if unserved(model):
            errors.add(
                key_path(f"{path}.aliases", glob),
                f"{quote(model)} is served by none of the route's hosts "
                f"(they serve {', '.join(sorted(served))})",
            )
    if route.unknown_model == "default" and not route.default_model:
        errors.add(
            f"{path}.unknown_model",
            '"default" needs the route\'s default_model (the model to serve instead)',
        )
    for peer in route.peers:
        if not route_exists(peer):
            errors.add(f"{path}.peers", f"unknown route {quote(peer)}")
    for fallback in route.fallbacks:
        if not route_exists(fallback):
            errors.add(f"{path}.fallbacks", f"unknown route {quote(fallback)}")
    if len(set(route.fallbacks)) != len(route.fallbacks):
        errors.add(f"{path}.fallbacks", "names a route twice")
    if len(set(route.keys)) != len(route.keys):
        errors.add(f"{path}.keys", "lists a key twice")
