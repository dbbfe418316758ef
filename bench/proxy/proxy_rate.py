"""Benchmark one crossbar process against the upstream direct and against nginx as the proxy.

    .venv/bin/python bench/proxy/proxy_rate.py [--duration 10] [--warmup 3] [--connections 32]
                                         [--runs 3] [--json]

The upstream is nginx answering every chat completion with one fixed answer (usage included),
the load is wrk posting a chat body for 1,000 conversations in turn, so crossbar is what is
measured: it keeps a lease per conversation and writes a usage row per request to an SQLite
file, as in production. Each run measures, in this order, the upstream direct, nginx as the
proxy (bench/common/nginx-proxy.conf, keep-alive to the upstream) and crossbar under twistd, each at
`--connections` and at 1 connection, after a warm-up that lasts until all 1,000 leases are
made (crossbar's admin API says so). Printed: req/s, p50/p99 per party, and per run:
crossbar/nginx-proxy req/s, crossbar's added p50/p99 over direct at c=1 and crossbar's CPU
per request; with several runs, the median of each.

Needs `nginx` and `wrk` on PATH (Debian: apt-get install nginx-light wrk); without nginx there
is no upstream, so the bench says so and stops.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.common.measure import NGINX_PROXY_CONF
from bench.fleet.scale import (
    ANSWER,
    CONFIG,
    CONVERSATIONS,
    MODEL,
    NGINX,
    ROUTE,
    TWISTD,
    WRK_SCRIPT,
    cpu_seconds,
    wait_http,
)
from bench.fleet.scale import wrk as run_wrk
from crossbar.demo.launch import free_ports

HERE = Path(__file__).parent


def start_nginx(work: Path, name: str, text: str, probe: str) -> subprocess.Popen:
    conf = work / f"{name}.conf"
    conf.write_text(text)
    process = subprocess.Popen(["nginx", "-c", str(conf), "-p", str(work)])
    wait_http(probe)
    return process


def stop_nginx(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGQUIT)
    process.wait(10)


def leases_made(admin: int) -> int:
    # the API answers a page of leases (100 by default) and how many there are in all
    url = f"http://127.0.0.1:{admin}/api/leases?limit=1"
    with urllib.request.urlopen(url, timeout=30) as answer:
        return int(json.loads(answer.read())["total"])


def measure(url: str, script: Path, args: argparse.Namespace, pid: int | None,
            admin: int | None = None) -> dict[str, Any]:  # fmt: skip
    run_wrk(url, script, args.connections, args.warmup)  # connections warm
    deadline = time.monotonic() + 120
    while admin and leases_made(admin) < CONVERSATIONS and time.monotonic() < deadline:
        # Measured is the steady state: every conversation has its lease (a new lease is a
        # store write; at a slow start most requests of a short warm-up would be new).
        run_wrk(url, script, args.connections, args.warmup)
    before = cpu_seconds(pid) if pid else 0.0
    started = time.monotonic()
    loaded = run_wrk(url, script, args.connections, args.duration)
    elapsed = time.monotonic() - started
    cpu = round(100 * (cpu_seconds(pid) - before) / elapsed) if pid else None
    single = run_wrk(url, script, 1, max(3.0, args.duration / 2))
    return {"loaded": loaded, "single": single, "cpu_percent": cpu}


def one_run(args: argparse.Namespace, work: Path) -> dict[str, dict[str, Any]]:
    upstream, proxy, port, admin = free_ports(4)
    script = work / "chat.lua"
    script.write_text(WRK_SCRIPT)
    origin = start_nginx(work, "upstream", NGINX.format(tmp=work, port=upstream, answer=ANSWER),
                         f"http://127.0.0.1:{upstream}/health")  # fmt: skip
    parties: dict[str, dict[str, Any]] = {}
    try:
        parties["direct"] = measure(f"http://127.0.0.1:{upstream}", script, args, None)
        template = NGINX_PROXY_CONF.read_text()
        text = template.replace("{tmp}", str(work)).replace("{port}", str(proxy))
        nginx = start_nginx(work, "proxy", text.replace("{upstream}", str(upstream)),
                            f"http://127.0.0.1:{proxy}/health")  # fmt: skip
        try:
            parties["nginx proxy"] = measure(f"http://127.0.0.1:{proxy}", script, args, nginx.pid)
        finally:
            stop_nginx(nginx)
        config = work / "crossbar.toml"
        db = work / f"crossbar-{time.monotonic_ns()}.db"
        text = CONFIG.format(port=port, admin=admin, db=db, route=ROUTE, upstream=upstream,
                             model=MODEL)  # fmt: skip
        config.write_text(text.replace("reuseport:", "tcp:"))
        log = (work / "crossbar.log").open("w")
        crossbar = subprocess.Popen([TWISTD, "-n", "--pidfile=", "crossbar", "-c", str(config)],
                                    cwd=work, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            wait_http(f"http://127.0.0.1:{admin}/api/status")
            parties["crossbar"] = measure(f"http://127.0.0.1:{port}", script, args, crossbar.pid,
                                          admin)  # fmt: skip
        finally:
            crossbar.send_signal(signal.SIGTERM)
            crossbar.wait(20)
            log.close()
    finally:
        stop_nginx(origin)
    return parties


def ratios(run: dict[str, dict[str, Any]]) -> dict[str, float]:
    direct, cb = run["direct"], run["crossbar"]
    out = {
        "crossbar req/s": cb["loaded"]["rps"],
        "c1 added p50 ms": cb["single"]["p50_ms"] - direct["single"]["p50_ms"],
        "c1 added p99 ms": cb["single"]["p99_ms"] - direct["single"]["p99_ms"],
    }
    if cb["cpu_percent"]:  # CPU per request: steadier than req/s on a machine shared with others
        out["crossbar cpu µs/req"] = 1e4 * cb["cpu_percent"] / cb["loaded"]["rps"]
    if "nginx proxy" in run:
        out["crossbar/nginx req/s"] = cb["loaded"]["rps"] / run["nginx proxy"]["loaded"]["rps"]
    return out


def report(runs: list[dict[str, dict[str, Any]]], args: argparse.Namespace) -> None:
    c = args.connections
    print(f"| run | party | c{c} req/s | c{c} p50 ms | c{c} p99 ms | c1 req/s | c1 p50 ms "
          f"| c1 p99 ms | cpu % (c{c}) | non-2xx |")  # fmt: skip
    print("|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for i, run in enumerate(runs, 1):
        for party, r in run.items():
            lo, one = r["loaded"], r["single"]
            cpu = "-" if r["cpu_percent"] is None else r["cpu_percent"]
            print(f"| {i} | {party} | {lo['rps']:.0f} | {lo['p50_ms']:.2f} | {lo['p99_ms']:.2f} "
                  f"| {one['rps']:.0f} | {one['p50_ms']:.3f} | {one['p99_ms']:.3f} | {cpu} "
                  f"| {lo['errors'] + one['errors']} |")  # fmt: skip
    print()
    table = [ratios(run) for run in runs]
    print("| ratio (per run) | values | median |")
    print("|---|---|--:|")
    for name in table[0]:
        values = [t[name] for t in table]
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"| {name} | {shown} | {statistics.median(values):.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON")
    args = parser.parse_args(argv)
    missing = [tool for tool in ("nginx", "wrk") if shutil.which(tool) is None]
    if missing:
        need = " and ".join(missing)
        print(f"bench: needs {need} on PATH, for the upstream and the load (Debian: "
              "apt-get install nginx-light wrk); nothing measured", file=sys.stderr)  # fmt: skip
        return 2
    runs = []
    with tempfile.TemporaryDirectory(prefix="crossbar-rate-") as tmp:
        for i in range(args.runs):
            work = Path(tmp) / f"run-{i}"
            work.mkdir()
            try:
                runs.append(one_run(args, work))
            except (SystemExit, subprocess.CalledProcessError):
                for log in sorted(work.glob("*.log")):
                    print(f"--- {log.name}\n{log.read_text()[-2000:]}", file=sys.stderr)
                raise
            print(f"  run {i + 1}: crossbar {runs[-1]['crossbar']['loaded']['rps']:.0f} req/s",
                  file=sys.stderr)  # fmt: skip
    if args.json:
        print(json.dumps(runs, indent=2))
    else:
        report(runs, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
