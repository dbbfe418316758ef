"""`crossbar init URL...`: a first config, written from what each llama-server says it serves.

It asks every server at once (survey.py), refuses whole when one cannot be put behind crossbar
(nothing is written), turns the answers into commented TOML (draft.py), checks that crossbar
takes it, and writes it to `-o FILE` or standard output. docs/reference.md, "Config",
`crossbar init`, states its flags, exit statuses and naming rules.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tomllib
from collections.abc import Mapping

from crossbar.cli.draft import Draft, Ports, Server, base_url, draft, same_server
from crossbar.config import ConfigError, parse_config, valid_name

TIMEOUT = 5.0  # seconds: an unreachable URL fails fast, a loaded llama-server answers in less

# Exit statuses: the command line or the output file is wrong (argparse's own), or a server
# cannot be put behind crossbar.
USAGE, SERVERS = 2, 1
_NAMED = re.compile(r"^(?P<name>[^=:/]+)=(?P<url>.+)$")  # `gpu1=http://10.0.0.7:8080`


class InitError(Exception):
    """Why init writes nothing, one line for the operator; `code` is the exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "init",
        help="write a first config for the llama-servers at these URLs (asks each what it serves)",
        description="Ask each llama-server what it serves (models, router mode, slots, context, "
        "whether it wants an API key) and write a short, commented crossbar config for them: "
        "a host per server, a route per model. Nothing is written if any server cannot be "
        "asked.",
    )
    p.add_argument(
        "urls",
        nargs="+",
        metavar="URL",
        help="a llama-server's base URL (http://gpu1:8080; gpu1:8080 means http://); "
        "NAME=URL names its host instead of init",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write it here (default: stdout)")
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    p.add_argument(
        "--api-key-env",
        action="append",
        default=[],
        metavar="NAME",
        help="an environment variable holding the API key of the servers that want one "
        "(repeatable: each such server takes the first that works); the config names the "
        "variable, never the key",
    )
    p.add_argument("--port", type=int, default=8080, help="crossbar's port for clients (8080)")
    p.add_argument(
        "--timeout",
        type=float,
        default=TIMEOUT,
        metavar="SECONDS",
        help=f"the longest each answer of a server may take, all of it ({TIMEOUT:g})",
    )
    p.add_argument(
        "--admin-port",
        type=int,
        metavar="PORT",
        help="its admin API's port, on 127.0.0.1 only (default: --port + 1)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The subcommand: 0 when the config was written."""
    try:
        written, notes = make(args, os.environ)
        for note in notes:
            print(f"crossbar init: {note}", file=sys.stderr)
        if args.output:
            _write(args.output, written.text, args.force)
            print(
                f"crossbar init: wrote {args.output}: hosts {', '.join(written.hosts)}; routes "
                f"{', '.join(written.routes)}; next: crossbar check {args.output}",
                file=sys.stderr,
            )
        else:
            sys.stdout.write(written.text)
    except InitError as e:
        print(f"crossbar init: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("crossbar init: interrupted; nothing written", file=sys.stderr)
        return 130
    return 0


def make(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[Draft, list[str]]:
    """The config and the notes for the operator (URLs taken as one); InitError when nothing
    is to be written."""
    from crossbar.cli.survey import NotServing, key_envs, survey_all  # only init asks servers

    ports = _ports(args)
    for name in args.api_key_env:
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) is None:
            raise InitError(f"--api-key-env {name!r} is not an environment variable name", USAGE)
    if args.output and os.path.exists(args.output) and not args.force:
        raise InitError(_exists(args.output), USAGE)
    wanted, notes = _servers(args.urls)
    if not args.timeout > 0:
        raise InitError(f"--timeout {args.timeout:g} is not a positive number of seconds", USAGE)
    keys = key_envs(args.api_key_env, environ)
    answers = survey_all([url for url, _ in wanted], keys, args.timeout)
    failed = [f"{url}: {a}" for (url, _), a in zip(wanted, answers, strict=True)
              if isinstance(a, NotServing)]  # fmt: skip
    if failed:
        lines = "\n  ".join(failed)
        raise InitError(f"nothing written; not every server can be put behind crossbar:\n"
                        f"  {lines}", SERVERS)  # fmt: skip
    servers = [
        Server(a.url, a.models, a.router, a.key_env, name, a.places)
        for (_, name), a in zip(wanted, answers, strict=True)
        if isinstance(a, Server)
    ]
    written = draft(servers, ports, args.output or "config.toml")
    _check(written.text, [s.key_env for s in servers if s.key_env])
    return written, notes


def _ports(args: argparse.Namespace) -> Ports:
    admin = args.admin_port
    if admin is None:  # the next port; a port of 0 (any free one, for tests) has no next
        admin = args.port + 1 if args.port else 0
    for flag, port in (("--port", args.port), ("--admin-port", admin)):
        if not 0 <= port <= 65535:
            raise InitError(f"{flag} {port} is not a TCP port", USAGE)
    if admin == args.port and admin:
        raise InitError("--port and --admin-port must differ", USAGE)
    return Ports(args.port, admin)


def _servers(texts: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """(base URL, host name given or "") per server, in order, each server once; and a note
    for each URL that names a server listed before it."""
    wanted: list[tuple[str, str]] = []
    notes = []
    for text in texts:
        named = _NAMED.match(text)
        name, url_text = (named["name"], named["url"]) if named else ("", text)
        if name and not valid_name(name):
            raise InitError(
                f"{text}: {name!r} is not a host name ([a-z0-9][a-z0-9._-]{{0,63}})", USAGE
            )
        try:
            url = base_url(url_text)
        except ValueError as e:
            raise InitError(str(e), USAGE) from None
        first = next((u for u, _ in wanted if same_server(u, url)), None)
        if first is not None:
            notes.append(f"{text} is the same server as {first}: one host")
            continue
        if name and name in {n for _, n in wanted}:
            raise InitError(f"two servers named {name!r}", USAGE)
        wanted.append((url, name))
    return wanted, notes


def _check(text: str, key_envs: list[str]) -> None:
    """crossbar must take what init writes; were it not to, that is init's bug, said as such
    rather than written."""
    try:
        parse_config(tomllib.loads(text), environ=dict.fromkeys(key_envs, "set"))
    except (ConfigError, tomllib.TOMLDecodeError) as e:
        raise InitError(f"a bug: crossbar refuses the config init made:\n{e}", SERVERS) from None


def _exists(path: str) -> str:
    return f"{path} exists; nothing written (--force overwrites it)"


def _write(path: str, text: str, force: bool) -> None:
    try:
        # "x": a file made meanwhile is not overwritten either.
        with open(path, "w" if force else "x", encoding="utf-8") as f:
            f.write(text)
    except FileExistsError:
        raise InitError(_exists(path), USAGE) from None
    except OSError as e:
        raise InitError(f"cannot write {path}: {e.strerror}", USAGE) from None
