"""The twistd plugin's options and service: `twistd -n crossbar -c config.toml`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

from twisted.application.service import IService
from twisted.python import usage

from crossbar.config import ConfigError, load_config
from crossbar.store import check as check_store


class Options(usage.Options):
    """Options of `twistd crossbar`."""

    optParameters = [
        ["config", "c", "config.toml", "Path to the crossbar TOML config."],
    ]

    def postOptions(self) -> None:
        self["config"] = str(Path(self["config"]).absolute())


def _die(lines: list[str], what: str) -> NoReturn:
    for line in lines:
        print(line, file=sys.stderr)
    print(f"crossbar: {what}; not starting", file=sys.stderr)
    raise SystemExit(2)


def makeService(options: Options) -> IService:
    """Load and validate the config and the store path, then build crossbar's service."""
    from crossbar.app.malloc import fix_mmap_threshold
    from crossbar.app.service import make_service

    fix_mmap_threshold()  # large request bodies go back to the system when they end
    try:
        config = load_config(options["config"])
    except ConfigError as e:
        _die(e.errors, f"{len(e.errors)} config error(s)")
    problem = check_store(config.server.db)
    if problem:
        _die([f"server.db: cannot open the store {config.server.db}: {problem}"], "no store")
    return make_service(config)
