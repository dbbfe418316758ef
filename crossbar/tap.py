"""The twistd plugin's options and service: `twistd -n crossbar -c config.toml`."""

from __future__ import annotations

import sys

from twisted.application.service import IService, MultiService
from twisted.python import usage

from crossbar.config import ConfigError, load_config


class Options(usage.Options):
    """Options of `twistd crossbar`."""

    optParameters = [
        ["config", "c", "config.toml", "Path to the crossbar TOML config."],
    ]


def makeService(options: Options) -> IService:
    """Load and validate the config, then build crossbar's service tree."""
    try:
        config = load_config(options["config"])
    except ConfigError as e:
        for line in e.errors:
            print(line, file=sys.stderr)
        print(f"crossbar: {len(e.errors)} config error(s); not starting", file=sys.stderr)
        raise SystemExit(2) from None
    service = MultiService()
    service.config = config  # type: ignore[attr-defined]
    return service
