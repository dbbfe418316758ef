"""The twistd plugin's options and service: `twistd -n crossbar -c config.toml`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn

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


def logs_to_stdout(twistd: Any) -> bool:
    """twistd's options (`twistd [options] crossbar ...`) leave its text lines on standard
    output: in the foreground, no `--logger`, `--syslog` or `--logfile` other than `-`."""
    if twistd is None or twistd.get("logger") or twistd.get("syslog"):
        return False
    return bool(twistd.get("nodaemon")) and twistd.get("logfile") in (None, "", "-")


def makeService(options: Options) -> IService:
    """Load and validate the config and the store path, then build crossbar's service.

    Where twistd would write its text lines on standard output (`twistd -n crossbar`, as
    under systemd), crossbar's text observer writes the same lines there, the request line at
    a fraction of the cost (app/logs.py); any logging option of twistd's own is left to it."""
    from crossbar.app.logs import text_observer
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
    service = make_service(config)
    if logs_to_stdout(getattr(options, "parent", None)):
        service.log_observer = text_observer()
    return service
