"""wrk's report (run with `--latency`) read into numbers: the benches that drive wrk share it."""

from __future__ import annotations

import re
from typing import Any

_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0, "h": 3600000.0}


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)([a-z]+)", text).groups()
    return float(value) * _UNITS[unit]


def parse_wrk(out: str) -> dict[str, Any]:
    """wrk's report (run with --latency): requests, seconds, req/s, p50/p75/p90/p99 in ms,
    non-2xx answers and socket errors. ValueError if it is not one."""
    done = re.search(r"(\d+) requests in ([\d.]+)(\w+),", out)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not done or not rate:
        raise ValueError(f"not a wrk report: {out.strip()[-300:]!r}")
    result: dict[str, Any] = {
        "requests": int(done.group(1)),
        "seconds": _ms(done.group(2) + done.group(3)) / 1000,
        "rps": float(rate.group(1)),
    }
    for q in ("50", "75", "90", "99"):
        found = re.search(rf"^\s+{q}%\s+([\d.]+[a-z]+)\s*$", out, re.M)
        result[f"p{q}_ms"] = _ms(found.group(1)) if found else None
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    result["non2xx"] = int(non2xx.group(1)) if non2xx else 0
    sockets = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
                        out)  # fmt: skip
    result["socket_errors"] = sum(int(x) for x in sockets.groups()) if sockets else 0
    return result
