"""`crossbar ctl evacuate HOST`: start an evacuation and show its progress until it is done.

The admin API answers at once; this polls `GET /api/hosts` and prints a progress line each
time it changes (rewritten in place on a terminal), then what was moved and that the host
can be stopped. `--no-wait` returns after starting it; `--now` also stops the host's running
streamed answers, each continued on its conversation's new host.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from crossbar.cli.client import AdminClient, CtlError, seg

POLL = 0.5  # seconds between looks at the progress


def progress(host: str, e: dict[str, Any]) -> str:
    """One line of an evacuation's progress."""
    total = e["total"]
    line = f"evacuating {host}: {e['moved']}/{total} moved ({e['warm']} warm), {e['left']} left"
    line += f", {e['failed']} could not move" if e["failed"] else ""
    return line + (f", {_streams(e)} moved" if e.get("now") else "")


def _streams(e: dict[str, Any]) -> str:
    n = e.get("stopped", 0)
    return f"{n} running answer{'' if n == 1 else 's'}"


def summary(host: str, e: dict[str, Any]) -> str:
    """What an evacuation did, once it is over."""
    done = f"host {host} evacuated: {e['moved']} of {e['total']} conversations moved "
    done += f"({e['warm']} prewarmed)"
    if e.get("now"):
        done += f", {_streams(e)} stopped and continued there"
    if e["failed"]:
        return done + f"; {e['failed']} could not move (a pin, or no other host) and stay"
    return done + "; it holds no leases and can be stopped"


def _evacuation(c: AdminClient, host: str) -> dict[str, Any]:
    for row in c.call("GET", "/api/hosts")["hosts"]:
        if row["name"] == host and row.get("evacuation"):
            return row["evacuation"]  # type: ignore[no-any-return]
    raise CtlError(f"crossbar shows no evacuation of {host}")


def evacuate(c: AdminClient, a: argparse.Namespace) -> tuple[Any, str]:
    """Start the evacuation of `a.host`; unless `a.no_wait`, follow it to its end."""

    body = {"now": True} if getattr(a, "now", False) else None
    answer = c.call("POST", f"/api/hosts/{seg(a.host)}/evacuate", body)
    e = answer["evacuation"]
    if a.no_wait or getattr(a, "json", False):
        return answer, progress(a.host, e)
    tty = sys.stderr.isatty()
    shown = ""
    while e["running"]:
        line = progress(a.host, e)
        if line != shown:
            sys.stderr.write(("\r\033[K" if tty else "") + line + ("" if tty else "\n"))
            sys.stderr.flush()
            shown = line
        time.sleep(POLL)
        e = _evacuation(c, a.host)
    if tty and shown:
        sys.stderr.write("\r\033[K")
    answer["evacuation"] = e
    return answer, summary(a.host, e)
