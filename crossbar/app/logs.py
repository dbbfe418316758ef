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
    host, model, lease = row.host or "-", row.model or "-", row.lease or "-"
    queue_ms = row.queue_ms or 0.0
    error = f" error={row.error!r}" if row.error else ""
    key = f" key={row.key}" if row.key else ""  # the key's name only: never its secret
    if row.fallback_from:
        key += f" fallback_from={row.fallback_from} fallback={row.fallback_reason}"
    # Formatted here in one f-string: twisted.logger's own formatting of a dozen fields was
    # most of the line's cost, a few percent of the proxy's CPU. The fields stay in the event
    # for JSON observers.
    line = (
        f"{row.route} {row.path} -> {host} {model} {row.status} lease={lease} "
        f"queue={queue_ms:.0f}ms ttfb={ttfb}ms "
        f"tokens={row.prompt_tokens}/{row.cached_tokens}/{row.completion_tokens}{key}{error}"
    )
    log.info(
        "{line}",
        line=line,
        route=row.route,
        path=row.path,
        host=host,
        model=model,
        status=row.status,
        lease=lease,
        queue_ms=queue_ms,
        ttfb=ttfb,
        prompt=row.prompt_tokens,
        cached=row.cached_tokens,
        completion=row.completion_tokens,
        error=error,
        key=row.key,
        fallback_from=row.fallback_from,
        fallback_reason=row.fallback_reason,
    )


def json_observer() -> Any:
    """For `twistd --logger crossbar.logs.json_observer`: JSON text sequences (RFC 7464: each
    record starts with 0x1E and ends with a newline) on stdout; read them with `jq --seq`."""
    return jsonFileLogObserver(sys.stdout)
