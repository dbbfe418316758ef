"""Log lines operators read: one per request; a text observer that writes them cheaply; and a
JSON observer for machines."""

from __future__ import annotations

import sys
from typing import Any

from twisted.logger import (
    FileLogObserver,
    LogEvent,
    Logger,
    formatEventAsClassicLogText,
    formatTime,
    jsonFileLogObserver,
    timeFormatRFC3339,
)

from crossbar.records import UsageRow
from crossbar.wire import printable, printable_lines

_REQUEST = "crossbar.request"
log = Logger(namespace=_REQUEST)


def log_request(row: UsageRow) -> None:
    """One line per request: route, host, model, status, lease kind, queue, TTFB, tokens."""
    ttfb = f"{row.ttfb_ms:.0f}" if row.ttfb_ms is not None else "-"
    # Every field a client or a host chose is escaped: a CR LF in a path or a model id would
    # write a forged line of its own, an ESC reach the operator's terminal.
    host, model, lease = printable(row.host or "-"), printable(row.model or "-"), row.lease or "-"
    route, path = printable(row.route), printable(row.path)
    queue_ms = row.queue_ms or 0.0
    error = f" error={row.error!r}" if row.error else ""
    key = f" key={printable(row.key)}" if row.key else ""  # the key's name, never its secret
    if row.request_class and row.request_class != "standard":
        key += f" class={row.request_class}"  # standard, the default, goes unsaid
    if row.fallback_from:
        key += f" fallback_from={printable(row.fallback_from)} fallback={row.fallback_reason}"
    if row.resumed:
        key += f" resumed={row.resumed}"
    # Formatted here in one f-string: twisted.logger's own formatting of a dozen fields was
    # most of the line's cost, a few percent of the proxy's CPU. The fields stay in the event
    # for JSON observers.
    line = (
        f"{route} {path} -> {host} {model} {row.status} lease={lease} "
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
        request_class=row.request_class,
        resumed=row.resumed,
    )


class ClassicText:
    """twistd's own text line for an event (`<time> [<namespace>#<level>] <text>`), at a
    fraction of its cost for the request line: the time is formatted once a second, not once
    an event (its time zone worked out each time was a third of the line's cost), and a request
    line is written as `log_request` made it, without parsing its format again."""

    def __init__(self) -> None:
        self._second: int | None = None
        self._stamp = "-"

    def time(self, when: float | None) -> str:
        """`when` as twistd writes it (RFC 3339, local time), worked out once a second."""
        if when is None:
            return "-"
        second = int(when)
        if second != self._second:
            self._second = second
            self._stamp = formatTime(second, timeFormatRFC3339)
        return self._stamp

    def __call__(self, event: LogEvent) -> str | None:
        if event.get("log_namespace") == _REQUEST and event.get("log_format") == "{line}":
            level = event.get("log_level")
            name = level.name if level is not None else "-"
            return f"{self.time(event.get('log_time'))} [{_REQUEST}#{name}] {event['line']}\n"
        text = formatEventAsClassicLogText(event, formatTime=self.time)
        # Any line's fields may hold text from outside (a host's model id, a client's path):
        # only the event's own line breaks stay (twistd indents them), every other control
        # character is escaped, so none forges a line or reaches the terminal.
        return None if text is None else printable_lines(text[:-1]) + "\n"


def text_observer() -> Any:
    """For `twistd --logger crossbar.logs.text_observer`: the lines twistd writes on standard
    output by default, the request line at a fraction of the cost (`ClassicText`)."""
    return FileLogObserver(sys.stdout, ClassicText())


def json_observer() -> Any:
    """For `twistd --logger crossbar.logs.json_observer`: JSON text sequences (RFC 7464: each
    record starts with 0x1E and ends with a newline) on stdout; read them with `jq --seq`."""
    return jsonFileLogObserver(sys.stdout)
