"""Two or more builds of crossbar, alternated in one sitting: CPU per request at c=32 and the
latency at one connection, in front of bench/peers/peers.py's fixed nginx answer.

    .venv/bin/python bench/peers/crossbar_ab.py --rounds 3 \\
        --variant before=PYBIN=../before/.venv/bin/python --variant after=
    .venv/bin/python bench/peers/crossbar_ab.py --body 100k \\
        --variant pure=CROSSBAR_PURE=1 --variant compiled=

A variant is `NAME=ENV,ENV...`: environment settings for its twistd (`CROSSBAR_PURE=1`,
`PYTHONPATH=<checkout>`), and `PYBIN=<python>` for the venv whose twistd runs it (this one's by
default). Each round starts every variant afresh in turn (upstream, crossbar with a lease per
conversation, two warm-ups of 3 s), then measures `--duration` seconds at c=32 with the process
tree's CPU from /proc, and 4 s at c=1. The medians close the report. Ports 24000-24999, as
bench/peers/peers.py (not both at once). Needs nginx and wrk on PATH.

Read beside the spread between rounds of one variant: on a shared 2-core VM it is often 10%.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench.peers.peers import CONVERSATIONS, measure, write_script
from bench.peers.peers_setup import Sitting, start_crossbar, start_upstream
from crossbar.demo.processes import Processes


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """`NAME=K=V,K=V` as (NAME, {K: V})."""
    name, _, rest = text.partition("=")
    settings = dict(item.split("=", 1) for item in rest.split(",") if "=" in item)
    return name, settings


def one(settings: dict[str, str], body: str, duration: float) -> tuple[float, float, float]:
    """One variant once, measured as bench/peers/peers.py measures a router (`peers.measure`):
    (CPU µs per request at c=32, req/s at c=32, p50 ms at c=1)."""
    saved = dict(os.environ)
    python = settings.get("PYBIN", sys.executable)
    os.environ.update({k: v for k, v in settings.items() if k != "PYBIN"})
    work = Path(tempfile.mkdtemp(prefix="crossbar-ab-"))
    processes = Processes(work, False)
    try:
        args = argparse.Namespace(streams=0, crossbar_python=python, warmup=3.0,
                                  duration=duration)  # fmt: skip
        sitting = Sitting(args, processes, work)
        router = start_crossbar(sitting, start_upstream(sitting))
        script = write_script(sitting, body, False)
        row = measure(router, script, args, body, CONVERSATIONS[body])
        return row["cpu_us_per_request"], row["loaded"]["rps"], row["single"]["p50_ms"]
    finally:
        processes.stop()
        os.environ.clear()
        os.environ.update(saved)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", action="append", required=True, help="NAME=ENV,ENV...")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--body", choices=("small", "100k"), default="small")
    p.add_argument("--duration", type=float, default=8.0, help="seconds at c=32")
    args = p.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant]
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"load average before: {' '.join(load)}; body {args.body}", flush=True)
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _ in variants}
    for round_ in range(args.rounds):
        for name, settings in variants:
            cpu, rate, p50 = one(settings, args.body, args.duration)
            results[name].append((cpu, rate, p50))
            print(f"round {round_ + 1} {name:12s} CPU {cpu:7.1f} µs/request  {rate:7.0f} req/s"
                  f"  c=1 p50 {p50:.3f} ms", flush=True)  # fmt: skip
    for name, rows in results.items():
        cpus = sorted(r[0] for r in rows)
        print(f"{name:12s} CPU median {statistics.median(cpus):.0f} µs/request "
              f"({', '.join(f'{c:.0f}' for c in cpus)}); c=1 p50 median "
              f"{statistics.median(r[2] for r in rows):.3f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
