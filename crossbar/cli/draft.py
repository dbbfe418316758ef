"""What `crossbar init` writes, from what the llama-servers said: host and route names, and
the commented TOML. Pure: no sockets, no files; survey.py asks the servers, init.py runs it.

docs/reference.md, "Config", `crossbar init`, states the naming rules kept here.
"""

from __future__ import annotations

import ipaddress
import re
import textwrap
from collections import Counter
from collections.abc import Sequence
from urllib.parse import urlsplit

from attrs import frozen

from crossbar.config import http_url, server_of, valid_name

_NOT_NAME = re.compile(r"[^a-z0-9._-]+")
_NOT_HOST_NAME = re.compile(r"[^a-z0-9_-]+")  # no dots: a host name stays a bare TOML key
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_NAME_MAX = 64


@frozen
class Model:
    """One model a server listed: its id there, its state (a router's `loaded`, `unloaded`...;
    `loaded` for a server of one model) and, where its `/props` was read, its slots and
    tokens per slot."""

    name: str
    state: str = "loaded"
    slots: int | None = None
    ctx: int | None = None


@frozen
class Server:
    """One llama-server as it answered: its base URL, whether it is a router (its models
    loaded on demand), what it listed, and the environment variable whose key it took ("":
    it wanted none). `name` is the host name given on the command line (`NAME=URL`), if any."""

    url: str
    models: tuple[Model, ...]
    router: bool = False
    key_env: str = ""
    name: str = ""
    places: int | None = None  # a router's /props max_instances (0: no limit)


@frozen
class Ports:
    """crossbar's own ports: the clients' (every interface) and the admin API's (loopback)."""

    listen: int = 8080
    admin: int = 8081


def base_url(text: str) -> str:
    """A llama-server's base URL from the command line: `http://` added when no scheme is
    given, a trailing `/` dropped; ValueError saying why it is not one."""
    url = text.strip()
    if "://" not in url:
        url = "http://" + url
    try:
        return http_url(url)
    except ValueError as e:
        raise ValueError(f"{text!r} is not a llama-server's base URL: {e}") from None


def same_server(url: str, other: str) -> bool:
    """Whether two base URLs name one server, by the rule the config itself refuses two
    names for one server with: scheme, host (any case; every loopback name one), port (a
    default one written or not), path (a trailing `/` or not). llama-server says nothing
    that tells one process from another, so this is all there is to go by."""
    return server_of(url) == server_of(other)


def _clean(text: str, pattern: re.Pattern[str], fallback: str) -> str:
    """`text` as a valid name: lower case, each run of other characters one `-`, starting
    with a letter or digit, at most 64 characters."""
    name = pattern.sub("-", text.lower())
    name = re.sub(r"^[^a-z0-9]+", "", name)[:_NAME_MAX].rstrip("-.")
    return name if valid_name(name) else fallback


def _host_part(url: str) -> str:
    """The host's own name: `local` for this machine, an IP address with `-` for `.` and
    `:`, a DNS name's first label."""
    host = (urlsplit(url).hostname or "").lower().rstrip(".")
    if server_of(url)[1] == "loopback":
        return "local"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return _clean(host.split(".")[0], _NOT_HOST_NAME, "host")
    return _clean(address.compressed, _NOT_HOST_NAME, "host")


def _full_host(url: str) -> str:
    return _clean((urlsplit(url).hostname or "").rstrip("."), _NOT_HOST_NAME, "host")


def _port(url: str) -> int:
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def _suffixed(name: str, n: int) -> str:
    return f"{name[: _NAME_MAX - len(str(n)) - 1]}-{n}"


def _unique(names: Sequence[str], reserved: frozenset[str] = frozenset()) -> list[str]:
    """Names made unique in order: one taken before, or `reserved`, gets `-2`, `-3`..."""
    taken = set(reserved)
    out = []
    for name in names:
        unique, n = name, 1
        while unique in taken:
            n += 1
            unique = _suffixed(name, n)
        taken.add(unique)
        out.append(unique)
    return out


def _with_port(url: str) -> str:
    return f"{_host_part(url)}-{_port(url)}"


def _whole_with_port(url: str) -> str:
    return f"{_full_host(url)}-{_port(url)}"


def host_names(servers: Sequence[Server]) -> list[str]:
    """Each server's host name, unique: the name given (never changed), else its host's own
    name (`gpu1` for `http://gpu1.lan:8080`, `local` for this machine, `10-0-0-7` for an
    address), with `-<port>` where two would share one (`local-8081`, `local-8082`), then
    the whole host name with the port, then `-2`, `-3`."""
    given = frozenset(s.name for s in servers if s.name)
    names = [_host_part(s.url) for s in servers]
    for step in (_with_port, _whole_with_port):
        counts = Counter(n for s, n in zip(servers, names, strict=True) if not s.name)
        names = [
            n if counts[n] == 1 and n not in given else step(s.url)
            for s, n in zip(servers, names, strict=True)
        ]
    automatic = _unique([n for s, n in zip(servers, names, strict=True) if not s.name], given)
    unnamed = iter(automatic)
    return [s.name or next(unnamed) for s in servers]


def route_names(models: Sequence[str]) -> list[str]:
    """A route name per model, unique: the model's name in lower case, each run of
    characters a route name cannot hold one `-` (`Qwen3-8B:Q4_K_M` -> `qwen3-8b-q4_k_m`)."""
    return _unique([_clean(m, _NOT_NAME, "model") for m in models])


def toml_string(text: str) -> str:
    """`text` as a TOML basic string."""
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif (c < " " and c != "\t") or c == "\x7f":
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _shown(text: str) -> str:
    """`text` for a comment line: what a comment cannot hold (a line break) as `?`."""
    return "".join(c if c.isprintable() else "?" for c in text)


def _comment(text: str) -> list[str]:
    """`text` as comment lines of at most 99 characters."""
    return textwrap.wrap(_shown(text), 97, initial_indent="# ", subsequent_indent="# ",
                         break_long_words=False, break_on_hyphens=False)  # fmt: skip


def toml_key(key: str) -> str:
    """A table's key: bare when TOML allows it, else quoted (`"qwen2.5-coder"`)."""
    return key if _BARE_KEY.fullmatch(key) else toml_string(key)


def toml_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(toml_string(i) for i in items) + "]"


@frozen
class Draft:
    """The config `crossbar init` writes, as names and text."""

    hosts: list[str]  # one per server, in command-line order
    routes: dict[str, str]  # route name -> its model, in order of first listing
    default_route: str
    text: str


def _served(servers: Sequence[Server], names: list[str]) -> dict[str, list[str]]:
    """Model -> the hosts that list it, models in order of first listing, hosts in
    command-line order."""
    serving: dict[str, list[str]] = {}
    for server, host in zip(servers, names, strict=True):
        for m in server.models:
            hosts = serving.setdefault(m.name, [])
            if host not in hosts:
                hosts.append(host)
    return serving


def _size(slots: int | None, ctx: int | None) -> str:
    slots_text = f"{slots} slot{'s' if slots != 1 else ''}" if slots else "? slots"
    return f"{slots_text} of {ctx} tokens" if ctx else f"{slots_text}, context unknown"


def _host_table(server: Server, name: str) -> list[str]:
    if server.router:
        listed = ", ".join(
            f"{m.name} ({m.state}, {_size(m.slots, m.ctx)})"
            if m.state == "loaded"
            else f"{m.name} ({m.state})"
            for m in server.models
        )
        lines = _comment(
            f"{name}: a router-mode llama-server: crossbar serves what its GET /models lists "
            f"at run time (now: {listed}), each model's slots and context from its /props "
            "once it is loaded."
        )
    else:
        sizes = {(m.slots, m.ctx) for m in server.models}
        said = ", ".join(m.name for m in server.models)
        if len(sizes) == 1:
            said += f": {_size(*sizes.pop())} each (its /props)"
        lines = _comment(f"{name}: {said}")
    lines += [f"[hosts.{toml_key(name)}]", f"url = {toml_string(server.url)}"]
    if server.router:
        lines.append('models = "discover"')
        lines += _router_keys(server)
    else:
        lines.append(f"models = {toml_list([m.name for m in server.models])}")
    if server.key_env:
        lines.append(
            f"api_key_env = {toml_string(server.key_env)}"
            f"  # it wants a key (401 without): crossbar reads it from ${server.key_env}"
        )
    single = server.models[0] if len(server.models) == 1 and not server.router else None
    if single is not None and single.slots:
        lines.append(
            f"# parallel = {single.slots}  # unset: crossbar reads /props total_slots at each "
            "start; set it only to override"
        )
    if single is not None and single.ctx:
        lines.append(f"# ctx = {single.ctx}  # tokens per slot; unset: /props n_ctx")
    return lines


def _router_keys(server: Server) -> list[str]:
    """A router-mode host's model places: what its /props said, and the keys that steer
    crossbar's loads, commented."""
    if server.places:
        lines = [f"# max_loaded = {server.places}  # models it holds at once (its /props): "
                 "set it only to override"]  # fmt: skip
    else:
        lines = ["# max_loaded = 2  # it says it has no limit: set one if it holds only so many"]
    kept = next((m.name for m in server.models if m.state == "loaded"), server.models[0].name)
    lines.append(f"# keep_loaded = [{toml_string(kept)}]  # kept loaded here, its conversations "
                 "placed here first")  # fmt: skip
    lines.append('# swap_after = "2m"  # a model waits this long for the loaded ones\' turns; '
                 "unset: 4 loads")  # fmt: skip
    return lines


def draft(servers: Sequence[Server], ports: Ports, path: str) -> Draft:
    """The config for `servers` (at least one, each listing at least one model, no two the
    same server), saved at `path` (named in its comments)."""
    names = host_names(servers)
    serving = _served(servers, names)
    routes = dict(zip(route_names(list(serving)), serving, strict=True))
    # The default route: the model the most hosts serve, the first listed among equals.
    default = max(routes, key=lambda r: len(serving[routes[r]]))
    first = next(iter(routes))
    local = f"http://localhost:{ports.listen}"
    path = _shown(path)
    every = ", ".join(toml_string(n) for n in names)
    lines = [
        f"# crossbar, in front of {len(servers)} llama-server{'s' * (len(servers) != 1)}: "
        "written by `crossbar init` from what each said it serves.",
        "# Next:",
        f"#   crossbar check {path}           # validate it; print what it resolves to",
        f"#   twistd -n crossbar -c {path}    # run crossbar in the foreground (Ctrl-C stops it)",
        "# Then point a client at the route of its model (one route per model, below):",
        f"#   OpenAI SDKs and tools:           {local}/r/{first}/v1",
        f"#   Anthropic's SDKs, Claude Code:   {local}/r/{first}  (they add /v1/messages)",
        "# (from another machine: this machine's name for localhost). The dashboard is",
        f"# http://127.0.0.1:{ports.admin}/ and `crossbar ctl` talks to it from this machine.",
        '# Every key: docs/reference.md, "Config"; the operator guide explains them.',
        "",
        "[server]",
        f'listen = "tcp:{ports.listen}"  # the clients\' port, on every interface',
        f'admin_listen = "tcp:{ports.admin}:interface=127.0.0.1"  # admin API, dashboard, '
        "metrics: this machine only",
        'db = "crossbar.db"  # leases, pins, usage: an SQLite file in the directory crossbar '
        "runs in",
        f"default_route = {toml_string(default)}  # a request without /r/<route>/ goes here",
        "# Keeps each conversation's latest request on disk, so `crossbar ctl evacuate` moves",
        "# conversations warm (replayed on their new host first); 0 turns it off.",
        'handoff_store = "256MiB"',
    ]
    for server, name in zip(servers, names, strict=True):
        lines += ["", *_host_table(server, name)]
    for route, model in routes.items():
        hosts = ", ".join(toml_string(h) for h in serving[model])
        lines += [
            "",
            *_comment(
                f"OpenAI: {local}/r/{route}/v1, Anthropic and Claude Code: {local}/r/{route}"
            ),
            f"[routes.{toml_key(route)}]",
            f"hosts = [{hosts}]  # in preference order",
            f"default_model = {toml_string(model)}",
            'unknown_model = "default"  # other names (Claude Code\'s claude-*) get default_model',
        ]
    lines += [
        "",
        "# More routes without editing this file: a template serves every route name its",
        "# glob matches (a team, a project: /r/team-a/v1), each with leases, limits and",
        "# metrics of its own. Uncomment to serve /r/team-<anything>:",
        "# [templates.teams]",
        '# match = "team-*"',
        f"# hosts = [{every}]",
        f"# default_model = {toml_string(routes[default])}",
    ]
    return Draft(names, routes, default, "\n".join(lines) + "\n")
