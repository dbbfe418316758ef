"""The twistd plugin's options and service: `twistd -n crossbar -c config.toml`."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

from twisted.application.service import IService
from twisted.python import usage

from crossbar.config import Config, ConfigError, load_config


class Options(usage.Options):
    """Options of `twistd crossbar`."""

    optParameters = [
        ["config", "c", "config.toml", "Path to the crossbar TOML config."],
    ]

    def postOptions(self) -> None:
        self["config"] = str(Path(self["config"]).absolute())


def _die(lines: list[str], what: str) -> None:
    for line in lines:
        print(line, file=sys.stderr)
    print(f"crossbar: {what}; not starting", file=sys.stderr)
    raise SystemExit(2)


def check_store(path: str) -> str | None:
    """Open the SQLite file once before the reactor runs, for a clear error at start.

    Returns the problem in words, or None when the file can be opened and written.
    """
    if path == ":memory:":
        return None
    p = Path(path)
    if not p.parent.is_dir():
        return f"server.db: directory {str(p.parent)!r} does not exist"
    try:
        conn = sqlite3.connect(path, timeout=2)
        try:
            conn.execute("PRAGMA schema_version").fetchone()
            conn.execute("BEGIN IMMEDIATE")
            conn.rollback()
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        return f"server.db: cannot use {path!r} as a SQLite database: {e}"
    return None


def makeService(options: Options) -> IService:
    """Load and validate the config and the store path, then build crossbar's service."""
    from crossbar.service import make_service

    config: Config | None = None
    try:
        config = load_config(options["config"])
    except ConfigError as e:
        _die(e.errors, f"{len(e.errors)} config error(s)")
    assert config is not None
    problem = check_store(config.server.db)
    if problem:
        _die([problem], "the store cannot be opened")
    from crossbar.admin import admin_site

    return make_service(config, admin_factory=admin_site)
