"""Log lines operators read: one per request; and a JSON observer for machines."""

from __future__ import annotations

import sys
from typing import Any

from twisted.logger import Logger, jsonFileLogObserver

from crossbar.records import UsageRow

log = Logger(namespace="crossbar.request")


def log_request(row: UsageRow) -> None:
    """One line per request: route, host, model, status, lease kind, queue, TTFB, tokens."""
    ttfb = f"{row.ttfb_ms:.0f}" if row.ttfb_ms is not None else "-"
    log.info(
        "{route} {path} -> {host} {model} {status} lease={lease} queue={queue_ms:.0f}ms "
        "ttfb={ttfb}ms tokens={prompt}/{cached}/{completion}{error}",
        route=row.route,
        path=row.path,
        host=row.host or "-",
        model=row.model or "-",
        status=row.status,
        lease=row.lease or "-",
        queue_ms=row.queue_ms or 0.0,
        ttfb=ttfb,
        prompt=row.prompt_tokens,
        cached=row.cached_tokens,
        completion=row.completion_tokens,
        error=f" error={row.error!r}" if row.error else "",
    )


def json_observer() -> Any:
    """For `twistd --logger crossbar.logs.json_observer`: JSON text sequences (RFC 7464: each
    record starts with 0x1E and ends with a newline) on stdout; read them with `jq --seq`."""
    return jsonFileLogObserver(sys.stdout)
