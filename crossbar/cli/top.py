"""`crossbar ctl top`: a refreshing terminal view of a running crossbar, for operators
without a browser: hosts' slots and queues, requests per second and cache hits per route, and
the latest lease moves. `q` quits.

Each refresh reads the admin API (`/api/status`, `/api/hosts`, `/api/usage` over the last
`window` seconds, `/api/events`); `frame` turns what it read into lines, and only the loop
touches the terminal: cbreak mode to read `q` without Enter, the alternate screen, and the
terminal put back as it was on the way out, whatever ends it.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import sys
import termios
import time
import tty
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from attrs import frozen

from crossbar.cli.client import AdminClient, CtlError
from crossbar.cli.format import ago, table

MOVES = 8  # recent moves shown
_ENTER = "\x1b[?1049h\x1b[?25l"  # alternate screen, cursor hidden
_LEAVE = "\x1b[?25h\x1b[?1049l"
_HOME = "\x1b[H\x1b[2J"


@frozen
class Snapshot:
    """What one refresh read from the admin API (or why it could not)."""

    status: dict[str, Any] | None
    hosts: list[dict[str, Any]]
    usage: list[dict[str, Any]]
    events: list[dict[str, Any]]
    error: str = ""

    def server_now(self, default: float) -> float:
        """crossbar's own time (its start plus its uptime), so "ago" is right whatever this
        machine's clock says; `default` when unknown."""
        status = self.status or {}
        if isinstance(status.get("started"), float | int) and isinstance(
            status.get("uptime"), float | int
        ):
            return float(status["started"] + status["uptime"])
        return default


def read(client: AdminClient, window: float) -> Snapshot:
    """One refresh's worth of the admin API; a failure is kept in `error`, not raised."""
    try:
        return Snapshot(
            status=client.call("GET", "/api/status"),
            hosts=client.call("GET", "/api/hosts")["hosts"],
            usage=client.call("GET", "/api/usage", by="route", since=f"{window:g}s")["usage"],
            events=client.call("GET", "/api/events", limit=200)["events"],
        )
    except CtlError as e:
        return Snapshot(None, [], [], [], str(e))


def moves(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events that moved a conversation from one host to another, newest first."""
    return [e for e in events if e["from_host"] and e["to_host"] and e["model"]][:MOVES]


def frame(snap: Snapshot, base: str, now: float, window: float) -> list[str]:
    """The lines of one screen; `now` is this machine's time, for the clock at the top."""
    out = [f"crossbar top  {base}  {time.strftime('%H:%M:%S', time.localtime(now))}"
           "   q quits"]  # fmt: skip
    now = snap.server_now(now)
    if snap.error:
        return [*out, "", snap.error, "", "(trying again at the next refresh)"]
    status = snap.status or {}
    hosts = status.get("hosts", {})
    store = status.get("store", {})
    out.append(
        f"{hosts.get('healthy', 0)}/{hosts.get('configured', 0)} hosts healthy; "
        f"{status.get('leases', 0)} leases; store {'DEGRADED' if store.get('degraded') else 'ok'}"
    )
    out += ["", *_hosts(snap.hosts).splitlines(), ""]
    out += [f"routes, last {window:g}s:", *_routes(snap.usage, window).splitlines(), ""]
    recent = moves(snap.events)
    out.append("recent moves:" if recent else "recent moves: none")
    rows = [[ago(max(0.0, now - e["at"])), e["reason"], e["route"], e["fp"] or "(route)",
             e["model"], f"{e['from_host']} -> {e['to_host']}"] for e in recent]  # fmt: skip
    if rows:
        out += table(["AGO", "REASON", "ROUTE", "CONVERSATION", "MODEL", "MOVE"], rows).splitlines()
    return out


def _hosts(hosts: list[dict[str, Any]]) -> str:
    rows = []
    for h in hosts:
        health = ("healthy" if h["healthy"] else "UNHEALTHY") + (
            " draining" if h["draining"] else ""
        )
        for m in h["models"] or [{"name": "-", "in_flight": 0, "parallel": 0, "queued": 0,
                                  "leases": 0, "state": None}]:  # fmt: skip
            slots = f"{m['in_flight']}/{m['parallel']}"
            rows.append([h["name"], health, m["name"], m.get("state") or "-", slots,
                         m["queued"], _classes(m.get("classes")), m["leases"]])  # fmt: skip
    return table(["HOST", "HEALTH", "MODEL", "STATE", "SLOTS", "QUEUED", "I/S/B", "LEASES"], rows)


def _classes(classes: dict[str, dict[str, int]] | None) -> str:
    """Slots held per class, interactive/standard/batch, and waiters after a `+` where any."""
    if not classes:
        return "-"
    order = ("interactive", "standard", "batch")
    held = "/".join(str(classes[c]["in_flight"]) for c in order)
    waiting = [classes[c]["queued"] for c in order]
    return held + (f" +{'/'.join(map(str, waiting))}" if any(waiting) else "")


def _routes(usage: list[dict[str, Any]], window: float) -> str:
    rows = []
    for u in usage:
        prompt = u["prompt_tokens"] or 0
        hit = f"{100 * (u['cached_tokens'] or 0) / prompt:.1f}%" if prompt else "-"
        ttfb = u["ttfb_p50_ms"]
        rows.append([u["route"], f"{u['requests'] / window:.2f}", u["requests"], u["errors"],
                     hit, "-" if ttfb is None else f"{ttfb:.0f}"])  # fmt: skip
    if not rows:
        return "(no requests)"
    return table(["ROUTE", "REQ/S", "REQUESTS", "ERRORS", "CACHE HIT", "TTFB P50 MS"], rows)


def fit(lines: list[str], columns: int, rows: int) -> str:
    """The screen cut to the terminal's size."""
    return "\n".join(line[:columns] for line in lines[: max(1, rows - 1)])


@contextlib.contextmanager
def _terminal(out: TextIO, fd: int) -> Iterator[None]:
    """cbreak mode and the alternate screen while top runs; everything put back after."""
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    out.write(_ENTER)
    try:
        yield
    finally:
        out.write(_LEAVE)
        out.flush()
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _key(fd: int, timeout: float) -> str:
    """A key pressed within `timeout` seconds, or ""."""
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return ""
    data = os.read(fd, 32)
    return data.decode("utf-8", "replace") if data else "q"  # end of input: as good as q


def run(
    client: AdminClient,
    interval: float,
    window: float,
    once: bool = False,
    clock: Callable[[], float] = time.time,
    out: TextIO | None = None,
    stdin: TextIO | None = None,
) -> int:
    """Refresh every `interval` seconds until `q`; one plain frame with `once`, or when
    stdin is not a terminal. Returns the exit status."""
    out, stdin = out or sys.stdout, stdin or sys.stdin
    if once or not stdin.isatty():
        out.write("\n".join(frame(read(client, window), client.base, clock(), window)) + "\n")
        return 0
    fd = stdin.fileno()
    with _terminal(out, fd), contextlib.suppress(KeyboardInterrupt):
        while True:
            lines = frame(read(client, window), client.base, clock(), window)
            size = shutil.get_terminal_size()
            out.write(_HOME + fit(lines, size.columns, size.lines))
            out.flush()
            if _key(fd, interval).lower().startswith("q"):
                break
    return 0
