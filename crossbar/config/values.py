"""The TOML config as frozen values: server settings, hosts and their models, routes, templates
(docs/reference.md, "Config")."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from attrs import field, frozen
from twisted.internet.endpoints import serverFromString
from twisted.internet.testing import MemoryReactor

from crossbar.config.fields import NAME, Errors, Section, quote, type_name
from crossbar.config.keys import KeyConfig, read_keys
from crossbar.config.redaction import redact
from crossbar.config.route import (
    Route,
    Template,
    check_route_links,
    fallback_loop,
    read_routes,
    read_templates,
)
from crossbar.config.tracing import TracingConfig, read_tracing
from crossbar.config.units import format_size

_RESOLVED_MAX = 10_000  # template routes a config remembers (then it makes them each time)

_DAY = 86400.0
DISCOVER = "discover"


class ConfigError(Exception):
    """A config that cannot be used; `errors` holds every problem as "dotted.path: message"."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = list(errors)


@frozen
class ServerConfig:
    """`[server]`: listeners, store, timers and limits. Durations are seconds, sizes bytes."""

    listen: str = "tcp:8080"
    admin_listen: str = "tcp:8081:interface=127.0.0.1"
    listen_backlog: int = 1024  # both ports' listen queue, unless their string sets backlog=
    admin_token: str = field(default="", repr=False)
    db: str = field(default="crossbar.db", repr=redact)  # a URL's password stays out of logs
    default_route: str = ""
    lease_idle: float = 2 * 3600.0
    sweep_interval: float = 30.0
    health_interval: float = 5.0
    health_timeout: float = 2.0
    unhealthy_after: int = 3
    healthy_after: int = 2
    flap_window: float = 600.0  # falls counted for flap damping (hosts/flaps.py)
    flap_holddown: float = 30.0  # hold-down per fall beyond the first within flap_window
    flap_holddown_max: float = 600.0
    sweep_batch: int = 200  # idle leases expired per transaction
    queue_max: int = 64
    queue_timeout: float = 300.0
    class_aging: float = 30.0  # a waiter rises one request class per this long waited
    max_body: int = 64 * 1024 * 1024
    max_body_memory: int = 256 * 1024 * 1024  # request bodies held at once, both ports together
    upstream_connect_timeout: float = 5.0
    upstream_idle_timeout: float = 600.0
    # Connections open or opening to one host at once; a request beyond waits for one to come
    # free, at most upstream_connect_queue_timeout, then 503.
    upstream_max_connections: int = 256
    upstream_connect_queue_timeout: float = 10.0
    fingerprint_chars: int = 4096
    usage_retention: float = 30 * _DAY
    usage_raw_retention: float = 2 * _DAY  # raw rows; per-minute sums after (usage_retention)
    events_retention: float = 30 * _DAY
    metrics_routes: tuple[str, ...] = ()  # template routes labelled by name in /metrics
    metrics_keys: tuple[str, ...] = ()  # client keys labelled by name in /metrics
    shutdown_grace: float = 30.0
    remember_ids: int = 100_000
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    body_deadline: float = 60.0  # a whole body, from its first byte
    client_write_timeout: float = 60.0
    handoff_store: int = 0  # bytes of compressed bodies kept on disk for warm hand-offs; 0 off
    handoff_max_body: int = 16 * 1024 * 1024  # larger bodies are not kept
    prewarm_parallel: int = 1  # prewarms at once per host
    prewarm_timeout: float = 30.0  # longest a turn waits for its conversation's prewarm
    # The longest a store statement may take (SQLite's busy wait, PostgreSQL's statement and
    # lock timeouts, connect and TCP timeouts): past it crossbar routes from memory.
    store_timeout: float = 5.0
    # The Batch API (docs/reference.md, "Batches").
    batch_max_file: int = 64 * 1024 * 1024  # an uploaded file larger than this is refused
    batch_max_requests: int = 50_000  # request lines in one batch file
    batch_retries: int = 3  # a host's failure of an item is tried again this many times
    batch_claim_timeout: float = (
        60.0  # an instance's claims run out this long after its last renewal
    )
    batch_in_flight: int = (
        0  # items one instance runs at once; 0: every slot of the fleet + 1 a host
    )
    batch_retention: float = 30 * _DAY  # ended batches and their files are pruned after this


@frozen
class ModelConfig:
    """One model a host serves; `parallel`/`ctx` of None mean "discover from /props"."""

    name: str
    upstream: str = ""
    parallel: int | None = None
    ctx: int | None = None

    @property
    def upstream_name(self) -> str:
        """The name sent upstream in "model"."""
        return self.upstream or self.name


# A host's models as they are now: configured, or discovered (hosts.Hosts.models).
Served = Callable[[str], "tuple[ModelConfig, ...]"]


@frozen
class HostConfig:
    """`[hosts.<name>]`: one llama-server endpoint and the models it serves. With
    `discover` (`models = "discover"`) the models are what the host's `GET /models` lists
    (a router-mode llama-server), `models` is empty, and `parallel`/`ctx` are the defaults
    of every discovered model."""

    name: str
    url: str
    models: tuple[ModelConfig, ...]
    api_key: str = field(default="", repr=False)
    discover: bool = False
    parallel: int | None = None
    ctx: int | None = None
    # Prompt tokens the host keeps warm over all its conversations (its slots and its
    # `--cache-ram`); None: learned from its evictions (leases/warmth.py).
    cache_tokens: int | None = None
    # The environment variable `api_key` was read from ("": the file gave it, or none).
    api_key_env: str = ""
    # Router mode (`discover`) only. Models the router keeps loaded at once (its
    # `--models-max`); None: its `/props` `max_instances`, else learned from its evictions.
    max_loaded: int | None = None
    # Models kept loaded here: loaded by crossbar when the router lists them unloaded, never
    # given up for another model, and their new conversations placed here first.
    keep_loaded: tuple[str, ...] = ()
    # How long a model's turns wait while the loaded models' turns keep the router's places
    # busy, before the least wanted one is let drain and unloaded for it; None: a few of the
    # waiting model's load times (limiter/swaps.py).
    swap_after: float | None = None

    def model(self, name: str) -> ModelConfig | None:
        for m in self.models:
            if m.name == name:
                return m
        return None

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)


@frozen
class Config:
    """The whole resolved config. Hosts and templates keep file order."""

    server: ServerConfig
    hosts: dict[str, HostConfig]
    routes: dict[str, Route]
    templates: tuple[Template, ...] = ()
    path: str = ""
    keys: dict[str, KeyConfig] = field(factory=dict)  # `[keys.<name>]`, seeded into the store
    tracing: TracingConfig | None = None  # None: no [tracing] table, no spans
    # Routes made from templates, by name: a request's route is looked up several times
    # (routing, the limiter, metrics labels), and making one costs ~10 µs. Bounded, for names
    # are the clients'.
    _resolved: dict[str, Route] = field(factory=dict, init=False, eq=False, repr=False)

    def route(self, name: str) -> Route | None:
        """The concrete route `name`, else the first template in file order that serves it."""
        concrete = self.routes.get(name) or self._resolved.get(name)
        if concrete is not None:
            return concrete
        if NAME.fullmatch(name) is None:
            return None
        for template in self.templates:
            if template.serves(name):
                route = template.resolve(name)
                if len(self._resolved) < _RESOLVED_MAX:
                    self._resolved[name] = route
                return route
        return None

    def models_of(self, route: Route, served: Served | None = None) -> list[str]:
        """Every model some host of the route serves, in host then model order. `served`
        gives a host's models as they are now (discovered ones included); without it, the
        configured ones."""
        served = served or self._configured
        seen: dict[str, None] = {}
        for host in route.hosts:
            for m in served(host):
                seen.setdefault(m.name, None)
        return list(seen)

    def hosts_for(self, route: Route, model: str, served: Served | None = None) -> list[str]:
        """The route's candidate hosts that serve `model`, in preference order."""
        served = served or self._configured
        return [h for h in route.hosts if any(m.name == model for m in served(h))]

    def _configured(self, host: str) -> tuple[ModelConfig, ...]:
        return self.hosts[host].models


def _read_server(errors: Errors, data: Any) -> ServerConfig:
    t = Section(errors, "server", data)
    d = ServerConfig()
    server = ServerConfig(
        listen=t.string("listen", d.listen),
        admin_listen=t.string("admin_listen", d.admin_listen),
        listen_backlog=t.integer("listen_backlog", d.listen_backlog, maximum=65535),
        admin_token=t.string("admin_token", d.admin_token),
        db=t.string("db", d.db),
        default_route=t.string("default_route", d.default_route),
        lease_idle=t.duration("lease_idle", d.lease_idle),
        sweep_interval=t.duration("sweep_interval", d.sweep_interval),
        health_interval=t.duration("health_interval", d.health_interval),
        health_timeout=t.duration("health_timeout", d.health_timeout),
        unhealthy_after=t.integer("unhealthy_after", d.unhealthy_after),
        healthy_after=t.integer("healthy_after", d.healthy_after),
        flap_window=t.duration("flap_window", d.flap_window),
        flap_holddown=t.duration("flap_holddown", d.flap_holddown, positive=False),
        flap_holddown_max=t.duration("flap_holddown_max", d.flap_holddown_max, positive=False),
        sweep_batch=t.integer("sweep_batch", d.sweep_batch),
        queue_max=t.integer("queue_max", d.queue_max, minimum=0),
        queue_timeout=t.duration("queue_timeout", d.queue_timeout),
        class_aging=t.duration("class_aging", d.class_aging),
        max_body=t.size("max_body", d.max_body),
        max_body_memory=t.size("max_body_memory", d.max_body_memory),
        upstream_connect_timeout=t.duration("upstream_connect_timeout", d.upstream_connect_timeout),
        upstream_idle_timeout=t.duration("upstream_idle_timeout", d.upstream_idle_timeout),
        upstream_max_connections=t.integer(
            "upstream_max_connections", d.upstream_max_connections, maximum=65535
        ),
        upstream_connect_queue_timeout=t.duration(
            "upstream_connect_queue_timeout", d.upstream_connect_queue_timeout
        ),
        fingerprint_chars=t.integer("fingerprint_chars", d.fingerprint_chars),
        usage_retention=t.duration("usage_retention", d.usage_retention),
        usage_raw_retention=t.duration("usage_raw_retention", d.usage_raw_retention),
        events_retention=t.duration("events_retention", d.events_retention),
        metrics_routes=t.string_list("metrics_routes", d.metrics_routes),
        metrics_keys=t.string_list("metrics_keys", d.metrics_keys),
        shutdown_grace=t.duration("shutdown_grace", d.shutdown_grace, positive=False),
        remember_ids=t.integer("remember_ids", d.remember_ids, minimum=0),
        header_timeout=t.duration("header_timeout", d.header_timeout),
        body_timeout=t.duration("body_timeout", d.body_timeout),
        body_deadline=t.duration("body_deadline", d.body_deadline),
        client_write_timeout=t.duration("client_write_timeout", d.client_write_timeout),
        handoff_store=t.size("handoff_store", d.handoff_store, minimum=0),
        handoff_max_body=t.size("handoff_max_body", d.handoff_max_body),
        prewarm_parallel=t.integer("prewarm_parallel", d.prewarm_parallel),
        prewarm_timeout=t.duration("prewarm_timeout", d.prewarm_timeout),
        store_timeout=t.duration("store_timeout", d.store_timeout),
        batch_max_file=t.size("batch_max_file", d.batch_max_file),
        batch_max_requests=t.integer("batch_max_requests", d.batch_max_requests),
        batch_retries=t.integer("batch_retries", d.batch_retries, minimum=0),
        batch_claim_timeout=t.duration("batch_claim_timeout", d.batch_claim_timeout),
        batch_in_flight=t.integer("batch_in_flight", d.batch_in_flight, minimum=0),
        batch_retention=t.duration("batch_retention", d.batch_retention),
    )
    t.finish()
    for key in ("listen", "admin_listen"):
        _check_endpoint(errors, f"server.{key}", getattr(server, key), server.listen_backlog)
    sizes_read = not any(line.startswith("server.max_body") for line in errors.lines)
    if sizes_read and server.max_body_memory < server.max_body:
        # A body larger than the bound could never be taken: 503 "try again" forever.
        errors.add(
            "server.max_body_memory",
            f"must be at least max_body ({quote(format_size(server.max_body))}), "
            f"not {quote(format_size(server.max_body_memory))}",
        )
    if not server.db:
        errors.add("server.db", 'must name a SQLite file (or ":memory:") or a PostgreSQL URL')
    return server


# The endpoint kinds whose parser takes a `backlog` (Twisted's and crossbar's `reuseport:`), and
# its index among their positional arguments.
_BACKLOG_AT = {"tcp": 2, "tcp6": 1, "ssl": 5, "unix": 2, "reuseport": 1}
_UNESCAPED_COLON = re.compile(r"(?<!\\):")


def with_backlog(description: str, backlog: int) -> str:
    """The endpoint string `description` with `backlog=` added, when its kind takes one and it
    sets none itself (by name or by position). Twisted's default of 50 is too short for a
    burst of clients: the rest wait on SYN retries, a second or more."""
    kind, _, rest = description.partition(":")
    position = _BACKLOG_AT.get(kind)
    if position is None or not rest:
        return description
    args = _UNESCAPED_COLON.split(rest)
    named = {a.split("=", 1)[0] for a in args if "=" in a}
    given = len([a for a in args if "=" not in a])
    if "backlog" in named or given > position:
        return description
    return f"{description}:backlog={backlog}"


def _check_endpoint(errors: Errors, path: str, description: str, backlog: int) -> None:
    try:
        serverFromString(MemoryReactor(), with_backlog(description, backlog))
    except Exception as e:  # the parser raises ValueError, KeyError, TypeError...
        errors.add(path, f"not a Twisted endpoint string ({quote(description)}: {e})")


def _read_models(t: Section, parallel: int | None, ctx: int | None) -> tuple[ModelConfig, ...]:
    path = t.sub("models")
    if not t.has("models"):
        t.errors.add(path, 'missing (a list of model names, a table per model, or "discover")')
        return ()
    raw = t.raw("models")
    if isinstance(raw, str):
        if raw != DISCOVER:
            t.errors.add(path, f'must be an array of names, a table per model, or "discover", '
                         f"not {quote(raw)}")  # fmt: skip
        return ()
    models: list[ModelConfig] = []
    if isinstance(raw, list):
        for i, name in enumerate(raw):
            if not isinstance(name, str) or not name:
                t.errors.add(f"{path}[{i}]", f"must be a model name, not {quote(name)}")
                continue
            models.append(ModelConfig(name=name, parallel=parallel, ctx=ctx))
    elif isinstance(raw, dict):
        for name, body in raw.items():
            mt = Section(t.errors, f"{path}.{name}", body)
            models.append(
                ModelConfig(
                    name=name,
                    upstream=mt.string("upstream"),
                    parallel=mt.integer("parallel", parallel),
                    ctx=mt.integer("ctx", ctx),
                )
            )
            mt.finish()
    else:
        t.errors.add(
            path,
            f'must be an array of names, a table per model, or "discover", not {type_name(raw)}',
        )
        return ()
    if not models and not t.errors:
        t.errors.add(path, "must name at least one model")
    _check_model_names(t.errors, path, models)
    return tuple(models)


def _check_model_names(errors: Errors, path: str, models: list[ModelConfig]) -> None:
    names: set[str] = set()
    upstreams: dict[str, str] = {}
    for m in models:
        if m.name in names:
            errors.add(f"{path}", f"model {quote(m.name)} is listed twice")
        names.add(m.name)
        other = upstreams.get(m.upstream_name)
        if other is not None:
            where = f"{path}.{m.name}.upstream" if m.upstream else f"{path}.{m.name}"
            errors.add(
                where,
                f"upstream name {quote(m.upstream_name)} is already used by model {quote(other)}",
            )
        else:
            upstreams[m.upstream_name] = m.name


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _key_from_env(
    errors: Errors, path: str, name: str, api_key: str, environ: Mapping[str, str]
) -> str:
    """The host's key from the environment variable `name` (`api_key_env`), so the file need
    not hold it; "" after reporting why it cannot be."""
    if _ENV_NAME.fullmatch(name) is None:
        errors.add(path, f"{quote(name)} is not an environment variable name")
    elif api_key:
        errors.add(path, "set api_key or api_key_env, not both")
    elif not environ.get(name):
        errors.add(
            path,
            f"the environment variable {name} is not set (it holds the host's key: set it "
            "where crossbar and `crossbar check` run)",
        )
    else:
        return environ[name]
    return ""


def _read_hosts(errors: Errors, data: Any, environ: Mapping[str, str]) -> dict[str, HostConfig]:
    hosts: dict[str, HostConfig] = {}
    outer = Section(errors, "hosts", data)
    for name in outer.keys():
        t = Section(errors, outer.sub(name), outer.raw(name))
        if NAME.fullmatch(name) is None:
            errors.add(t.path, f"bad host name {quote(name)} (use [a-z0-9][a-z0-9._-]{{0,63}})")
        url = t.url("url")
        api_key = t.string("api_key")
        api_key_env = t.string("api_key_env")
        if api_key_env:
            api_key = _key_from_env(errors, t.sub("api_key_env"), api_key_env, api_key, environ)
        parallel = t.integer("parallel", None)
        ctx = t.integer("ctx", None)
        cache_tokens = t.integer("cache_tokens", None)
        discover = t.peek("models") == DISCOVER
        if not discover:
            for key in ("max_loaded", "keep_loaded", "swap_after"):
                if t.has(key):
                    errors.add(t.sub(key), 'only for a router-mode host (models = "discover")')
        max_loaded = t.integer("max_loaded", None)
        keep_loaded = t.string_list("keep_loaded")
        swap_after = t.duration("swap_after", None)
        models = _read_models(t, parallel, ctx)
        _check_kept(errors, t.sub("keep_loaded"), keep_loaded, max_loaded)
        t.finish()
        hosts[name] = HostConfig(
            name, url, models, api_key, discover, parallel, ctx, cache_tokens, api_key_env,
            max_loaded, keep_loaded, swap_after,
        )  # fmt: skip
    return hosts


def _check_kept(errors: Errors, path: str, kept: tuple[str, ...], max_loaded: int | None) -> None:
    """`keep_loaded`: none twice, fewer than the router can hold (a place is left for every
    other model)."""
    seen: set[str] = set()
    for i, name in enumerate(kept):
        if name in seen:
            errors.add(f"{path}[{i}]", f"model {quote(name)} is listed twice")
        seen.add(name)
    if max_loaded is not None and len(kept) >= max_loaded and kept:
        errors.add(
            path,
            f"keeps {len(kept)} model(s) loaded but max_loaded is {max_loaded}: leave at least "
            "one place for the others",
        )


_LOOPBACK = {"localhost", "127.0.0.1", "::1", "0:0:0:0:0:0:0:1"}
_DEFAULT_PORTS = {"http": 80, "https": 443}


def server_of(url: str) -> tuple[str, str, int, str]:
    """What a host URL names, compared: scheme, host (every loopback name one), port (the
    scheme's default when unset), path without a trailing slash."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower().rstrip(".")
    if host in _LOOPBACK or host.startswith("127."):
        host = "loopback"
    port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 0)
    return parts.scheme, host, port, parts.path.rstrip("/")


def _check_one_name_per_server(errors: Errors, hosts: dict[str, HostConfig]) -> None:
    """Two names for one llama-server would book its slots twice (its `parallel` under each)."""
    seen: dict[tuple[str, str, int, str], str] = {}
    for name, host in hosts.items():
        if not host.url:
            continue
        server = server_of(host.url)
        first = seen.setdefault(server, name)
        if first != name:
            errors.add(
                f"hosts.{name}.url",
                f"{quote(host.url)} is the same server as hosts.{first} "
                f"({quote(hosts[first].url)}): one name per server, or its slots are booked "
                "twice",
            )


def parse_config(
    data: dict[str, Any], path: str = "", environ: Mapping[str, str] | None = None
) -> Config:
    """Build a Config from parsed TOML, or raise ConfigError listing every problem.
    `environ` holds the variables a host's `api_key_env` names and the `OTEL_*` ones that fill
    what `[tracing]` leaves out (none by default: what a test parses does not depend on the
    shell it runs in)."""
    errors = Errors()
    top = Section(errors, "", data)
    server = _read_server(errors, top.raw("server", {}))
    hosts = _read_hosts(errors, top.raw("hosts", {}), environ or {})
    routes = read_routes(errors, top.raw("routes", {}))
    templates = read_templates(errors, top.raw("templates", {}))
    keys = read_keys(errors, top.raw("keys", {}))
    tracing = None
    if top.has("tracing"):
        tracing = read_tracing(errors, top.raw("tracing"), environ or {})
    top.finish()
    config = Config(server, hosts, routes, tuple(templates), path, keys, tracing)
    if not hosts:
        errors.add("hosts", "no hosts configured (add a [hosts.<name>] table)")
    _check_one_name_per_server(errors, hosts)
    host_models: dict[str, set[str] | None] = {
        name: None if h.discover else set(h.model_names) for name, h in hosts.items()
    }

    def exists(name: str) -> bool:
        return config.route(name) is not None

    for name, route in routes.items():
        check_route_links(errors, f"routes.{name}", route, host_models, exists)
    for template in templates:
        check_route_links(errors, f"templates.{template.name}", template.route, host_models, exists)
    for name, route in routes.items():
        loop = fallback_loop(route, config.route)
        if loop is not None:
            errors.add(
                f"routes.{name}.fallbacks",
                f"a loop of fallbacks ({' -> '.join(loop)}): a fallback route's own fallbacks "
                "are never followed; list every route to try on the first one",
            )
    _check_key_links(errors, config)
    if server.default_route and not exists(server.default_route):
        errors.add("server.default_route", f"unknown route {quote(server.default_route)}")
    if errors:
        raise ConfigError(errors.lines)
    return config


_GLOB = re.compile(r"[*?\[]")


def _check_key_links(errors: Errors, config: Config) -> None:
    """A key's route names (not globs) must be routes the config serves; `metrics_keys` must
    be key names (a key made through the admin API may be listed too)."""
    for name, key in config.keys.items():
        for i, route in enumerate(key.routes):
            if not _GLOB.search(route) and config.route(route) is None:
                errors.add(f"keys.{name}.routes[{i}]", f"unknown route {quote(route)}")
    for i, name in enumerate(config.server.metrics_keys):
        if NAME.fullmatch(name) is None:
            errors.add(f"server.metrics_keys[{i}]", f"{quote(name)} is not a key name")


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate a TOML config file; every failure is a ConfigError naming the file.
    The hosts' `api_key_env` and the `OTEL_*` variables come from `environ`, the process's by
    default."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError([f"{p}: no such file"]) from None
    except IsADirectoryError:
        raise ConfigError([f"{p}: is a directory, not a config file"]) from None
    except OSError as e:
        raise ConfigError([f"{p}: cannot read: {e.strerror}"]) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError([f"{p}: not UTF-8 text"]) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"{p}: not valid TOML: {e}"]) from None
    return parse_config(data, str(p), os.environ if environ is None else environ)
