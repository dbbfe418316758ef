"""What the demo runs, read from a crossbar config: crossbar's ports, the hosts to fake, the route.

The config is the one source of truth: each `[hosts.X]` becomes one `crossbar-fakellama` on the
host's port, serving the host's models (by their upstream names) with its `parallel` and `ctx`.
For the smoke run, `rewrite` gives a copy of the config text on other ports and another db.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


class DemoError(Exception):
    """Something the demo cannot go on from; the message says what to do."""


@dataclass(frozen=True)
class FakeHost:
    """One fake llama-server to start for a configured host."""

    name: str
    url: str
    port: int
    models: tuple[str, ...]  # the names the host knows its models by (upstream names)
    parallel: int
    ctx: int


@dataclass(frozen=True)
class Plan:
    """The demo's view of one crossbar config."""

    path: Path
    text: str
    listen: str  # the endpoint strings, as written
    admin_listen: str
    listen_port: int
    admin_port: int
    db: str
    hosts: tuple[FakeHost, ...]
    route: str
    model: str
    template_route: str | None = None  # a route name the first template serves, if any

    @property
    def base(self) -> str:
        """crossbar's client URL on this machine."""
        return f"http://127.0.0.1:{self.listen_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}/"

    def route_url(self, path: str, route: str | None = None) -> str:
        return f"{self.base}/r/{route or self.route}{path}"


def endpoint_port(description: str, where: str) -> int:
    """The port of a `tcp:PORT[:interface=...]` endpoint string (the demo dials 127.0.0.1)."""
    parts = description.split(":")
    if parts[0] != "tcp":
        raise DemoError(f"{where}: the demo needs a tcp endpoint, not {description!r}")
    for part in parts[1:]:
        key, eq, value = part.partition("=")
        if not eq and key.isdigit():
            return int(key)
        if eq and key == "port" and value.isdigit():
            return int(value)
    raise DemoError(f"{where}: no port in {description!r}")


def _table(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise DemoError(f"{where}: missing or not a table")
    return data


def _fake_host(name: str, data: dict[str, Any]) -> FakeHost:
    url = str(data.get("url", ""))
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in ("127.0.0.1", "localhost") or not parts.port:
        raise DemoError(
            f"hosts.{name}.url: the demo fakes hosts on this machine; use http://127.0.0.1:PORT"
        )
    raw = data.get("models")
    models: list[str] = []
    parallel, ctx = data.get("parallel", 2), data.get("ctx", 8192)
    if isinstance(raw, list):
        models = [str(m) for m in raw]
    elif isinstance(raw, dict):
        for model, settings in raw.items():
            settings = _table(settings, f"hosts.{name}.models.{model}")
            models.append(str(settings.get("upstream") or model))
            parallel = settings.get("parallel", parallel)
            ctx = settings.get("ctx", ctx)
    if not models:
        raise DemoError(f"hosts.{name}.models: the demo needs at least one model")
    return FakeHost(name, url, parts.port, tuple(models), int(parallel), int(ctx))


def read_plan(path: str | Path, route: str = "convo") -> Plan:
    """Read the config at `path` for the demo; DemoError says what is missing."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except FileNotFoundError:
        raise DemoError(f"{p}: no such file (run the demo from the repository root)") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise DemoError(f"{p}: cannot read it: {e}") from None
    server = _table(data.get("server", {}), "server")
    listen = str(server.get("listen", "tcp:8080"))
    admin_listen = str(server.get("admin_listen", "tcp:8081:interface=127.0.0.1"))
    hosts = _table(data.get("hosts"), "hosts")
    fakes = tuple(_fake_host(name, _table(h, f"hosts.{name}")) for name, h in hosts.items())
    routes = _table(data.get("routes", {}), "routes")
    if route not in routes:
        raise DemoError(f"routes.{route}: the demo drives this route; add it to {p}")
    model = str(_table(routes[route], f"routes.{route}").get("default_model") or "")
    templates = _table(data.get("templates", {}), "templates")
    template_route = None
    for name, template in list(templates.items())[:1]:  # the first template, if any
        match = str(_table(template, f"templates.{name}").get("match", ""))
        template_route = match.replace("*", "smoke").replace("?", "x") or None
    return Plan(
        path=p,
        text=text,
        listen=listen,
        admin_listen=admin_listen,
        listen_port=endpoint_port(listen, "server.listen"),
        admin_port=endpoint_port(admin_listen, "server.admin_listen"),
        db=str(server.get("db", "crossbar.db")),
        hosts=fakes,
        route=route,
        model=model or fakes[0].models[0],
        template_route=template_route,
    )


def _replace_once(text: str, old: str, new: str, what: str) -> str:
    quoted = f'"{old}"'
    if text.count(quoted) != 1:
        raise DemoError(f"cannot move {what} for the smoke run: {quoted} must appear once")
    return text.replace(quoted, f'"{new}"')


def rewrite(plan: Plan, urls: dict[str, str], listen_port: int, admin_port: int, db: str) -> str:
    """The config text with the hosts at `urls`, crossbar on other ports and another db."""
    text = plan.text
    for host in plan.hosts:
        text = _replace_once(text, host.url, urls[host.name], f"hosts.{host.name}.url")
    listen = f"tcp:{listen_port}:interface=127.0.0.1"
    admin = f"tcp:{admin_port}:interface=127.0.0.1"
    text = _replace_once(text, plan.listen, listen, "server.listen")
    text = _replace_once(text, plan.admin_listen, admin, "server.admin_listen")
    text = _replace_once(text, plan.db, db, "server.db")
    return text
