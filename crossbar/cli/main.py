"""The `crossbar` console command: `init` a config from what llama-servers serve, `check` a
config, `ctl` a running crossbar, `migrate-store` a stopped one's store to another database."""

from __future__ import annotations

import argparse
import os
import sys

from crossbar.cli import ctl, init
from crossbar.cli.check import describe
from crossbar.config import ConfigError, load_config
from crossbar.store import MigrateError, migrate_store


def _check(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as e:
        for line in e.errors:
            print(line, file=sys.stderr)
        print(f"{args.config}: {len(e.errors)} error(s)", file=sys.stderr)
        return 2
    print(describe(config))
    return 0


def _migrate_store(args: argparse.Namespace) -> int:
    try:
        lines = migrate_store(args.source, args.target)
    except MigrateError as e:
        print(f"crossbar migrate-store: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="crossbar",
        description="A sticky reverse proxy for a fleet of llama.cpp llama-server hosts. "
        "Run the proxy with `twistd -n crossbar -c config.toml`.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    init.add_parser(sub)
    check = sub.add_parser("check", help="validate a config file and print what it resolves to")
    check.add_argument("config", help="path to the TOML config")
    check.set_defaults(func=_check)
    ctl.add_parser(sub)
    move = sub.add_parser(
        "migrate-store",
        help="copy a stopped crossbar's store (leases, pins, drains, events, usage) into an "
        "empty one, e.g. from its SQLite file to PostgreSQL",
    )
    move.add_argument("source", metavar="FROM", help="the store now in use: a file or URL")
    move.add_argument("target", metavar="TO", help="the empty store to fill: a file or URL")
    move.set_defaults(func=_migrate_store)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `crossbar` command."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "init" and not any(e.startswith("-") for e in extra):
        args.urls += extra  # URLs after a flag (`init URL --port 8000 URL`): argparse leaves them
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, not at exit: a closed pipe is caught below
    except BrokenPipeError:
        # The reader went away (`crossbar check config.toml | head -1`): nothing to report.
        # Python's own flush at exit must not hit the closed pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
