"""Does the admin side stall the data path? Proxy latency with a fleet's lease table, alone and
while a client fetches every admin endpoint the dashboard uses, back to back.

    .venv/bin/python bench/admin_load.py [--leases 100000] [--routes 1000] [--usage-rows 100000]
                                         [--duration 5] [--concurrency 4] [--json]

Writes a store (SQLite) holding `--leases` conversations over `--routes` template routes
(`team-*`) and `--usage-rows` usage rows of the last hour, starts `crossbar-fakellama` and
crossbar under twistd on it (crossbar loads the leases at start), then runs `--concurrency`
chat workers against one route for `--duration` seconds twice: first alone, then while one
admin client loops over the dashboard's requests (status, hosts, a page of routes and of
leases, a filtered lease page that scans every lease, the top tables, the chart, events,
instances) and /metrics. Prints the proxy's p50/p99 in both runs, the p99 rise, the admin
requests done, and crossbar's RSS and CPU.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from measure import Reader, cpu_seconds, percentile
from overhead import MODEL, chat_body, one_request
from twisted.internet import defer, task
from twisted.web.client import Agent, HTTPConnectionPool

from crossbar.demo.launch import free_ports, wait_ready
from crossbar.demo.plan import DemoError, read_plan
from crossbar.demo.processes import Processes, command, wait_for_line
from crossbar.store_setup import migrate

ROUTE = "bench"
DASHBOARD = [  # what one refresh of the dashboard asks, plus a Prometheus scrape
    "/api/status",
    "/api/hosts",
    "/api/routes?limit=20",
    "/api/leases?limit=50",
    "/api/leases?limit=50&host=fake",  # a filter: every lease is scanned
    "/api/events?limit=25",
    "/api/usage?by=route&since=3600s&sort=requests&limit=10",
    "/api/usage?by=route&since=3600s&sort=cache_hit_ratio&limit=10",
    "/api/moves?since=3600s&limit=10",
    "/api/usage/series?since=3600s&bucket=60s&top=8",
    "/api/instances",
    "/metrics",
]

CONFIG = """\
[server]
listen = "tcp:{listen}:interface=127.0.0.1"
admin_listen = "tcp:{admin}:interface=127.0.0.1"
db = "{db}"
health_interval = "1h"
health_timeout = "5s"
shutdown_grace = "1s"

[hosts.fake]
url = "{url}"
models = ["{model}"]
parallel = 64
ctx = 8192

[routes.{route}]
hosts = ["fake"]
default_model = "{model}"

[templates.teams]
match = "team-*"
hosts = ["fake"]
default_model = "{model}"
"""


def fill_store(db: Path, leases: int, routes: int, usage_rows: int) -> None:
    """The store crossbar starts on: the fleet's leases and an hour of usage, written by SQL."""
    conn = sqlite3.connect(db, isolation_level=None)
    migrate(conn)
    now = time.time()
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?) "
        "INSERT INTO leases SELECT 'team-' || (i % ?), printf('%016x', i), ?, 'fake', 'active', "
        "?, ? FROM n",
        (leases, routes, MODEL, now, now),
    )
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?) "
        "INSERT INTO usage (at, route, fp, model, host, path, status, stream, prompt_tokens, "
        "cached_tokens, completion_tokens, ttfb_ms, duration_ms) "
        "SELECT ? - (i % 3600), 'team-' || (i % ?), printf('%016x', i), ?, 'fake', "
        "'/v1/chat/completions', 200, 0, 1000, i % 1000, 50, 20 + i % 30, 200 FROM n",
        (usage_rows, now, routes, MODEL),
    )
    conn.execute("COMMIT")
    conn.close()


async def proxy_run(reactor: Any, url: str, concurrency: int, duration: float) -> dict[str, Any]:
    """`concurrency` chat workers for `duration` seconds: p50/p99 of the whole answer (ms)."""
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = concurrency
    agent = Agent(reactor, pool=pool)
    end = reactor.seconds() + duration
    latency: list[float] = []
    errors = 0

    async def worker(n: int) -> None:
        nonlocal errors
        body = chat_body(n, False)
        while reactor.seconds() < end:
            try:
                start, _, done = await one_request(agent, reactor, url.encode(), body, False)
            except Exception:
                errors += 1
                continue
            latency.append((done - start) * 1000)

    await defer.gatherResults([defer.ensureDeferred(worker(n)) for n in range(concurrency)])
    await pool.closeCachedConnections()
    return {
        "requests": len(latency),
        "errors": errors,
        "p50_ms": percentile(latency, 50),
        "p99_ms": percentile(latency, 99),
    }


async def admin_loop(reactor: Any, base: str, stop: list[bool], done: dict[str, Any]) -> None:
    """Fetch every dashboard request in turn until `stop[0]`; count them and their bytes."""
    agent = Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=True))
    while not stop[0]:
        for path in DASHBOARD:
            started = reactor.seconds()
            response = await agent.request(b"GET", (base + path).encode())
            reader = Reader(reactor)
            response.deliverBody(reader)
            body = await reader.done
            if response.code != 200:
                raise RuntimeError(f"{path}: HTTP {response.code} {body[:200]!r}")
            done["requests"] += 1
            done["bytes"] += len(body)
            took = (reactor.seconds() - started) * 1000
            done["slowest_ms"] = max(done["slowest_ms"], took)
            per = done.setdefault("slowest_by_path_ms", {})
            per[path] = round(max(per.get(path, 0.0), took), 1)


async def measure(reactor: Any, args: argparse.Namespace, urls: dict[str, str], pid: int) -> dict:
    """The two runs, and crossbar's memory and CPU."""
    await proxy_run(reactor, urls["proxy"], args.concurrency, 1.0)  # warm up
    cpu0 = cpu_seconds(pid)
    alone = await proxy_run(reactor, urls["proxy"], args.concurrency, args.duration)
    cpu1 = cpu_seconds(pid)
    stop, admin = [False], {"requests": 0, "bytes": 0, "slowest_ms": 0.0}
    loop = defer.ensureDeferred(admin_loop(reactor, urls["admin"], stop, admin))
    loaded = await proxy_run(reactor, urls["proxy"], args.concurrency, args.duration)
    cpu2 = cpu_seconds(pid)
    stop[0] = True
    await loop
    rss = _rss_mib(pid)
    return {
        "leases": args.leases,
        "routes": args.routes,
        "usage_rows": args.usage_rows,
        "alone": alone,
        "with_admin": loaded,
        "p99_rise_ms": loaded["p99_ms"] - alone["p99_ms"],
        "admin": admin,
        "crossbar_rss_mib": rss,
        "crossbar_cpu_pct": {
            "alone": 100 * (cpu1 - cpu0) / args.duration,
            "with_admin": 100 * (cpu2 - cpu1) / args.duration,
        },
    }


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main(argv: list[str] | None = None) -> int:
    """Fill the store, start the fake and crossbar, measure, stop them; print the report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--leases", type=int, default=100_000)
    p.add_argument("--routes", type=int, default=1000)
    p.add_argument("--usage-rows", type=int, default=100_000)
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per run")
    p.add_argument("--concurrency", type=int, default=4, help="chat workers")
    p.add_argument("--json", action="store_true", help="print JSON instead of lines")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="crossbar-admin-load-"))
    processes = Processes(work, record_pids=False)
    status, report = 1, None
    try:
        fill_store(work / "crossbar.db", args.leases, args.routes, args.usage_rows)
        fake_args = ["--port", "0", "--model", MODEL, "--parallel", "64",
                     "--tokens-per-second", "0", "--reply-tokens", "16"]  # fmt: skip
        fake = processes.start("fake", [command("crossbar-fakellama"), *fake_args])
        fake_url = wait_for_line(fake, r" at (http://\S+)", time.monotonic() + 30)[1]
        listen, admin = free_ports(2)
        config = work / "bench.toml"
        config.write_text(CONFIG.format(listen=listen, admin=admin, db=work / "crossbar.db",
                                        url=fake_url, model=MODEL, route=ROUTE))  # fmt: skip
        twistd = [command("twistd"), "-n", "--pidfile=", "crossbar", "-c", str(config)]
        proxy = processes.start("crossbar", twistd)
        plan = read_plan(config, ROUTE)
        wait_ready(plan, proxy)
        urls = {"proxy": plan.route_url("/v1/chat/completions"), "admin": plan.admin_url[:-1]}
        box: dict[str, Any] = {}

        async def run(reactor: Any) -> None:
            box["report"] = await measure(reactor, args, urls, proxy.pid)

        try:
            task.react(lambda r: defer.ensureDeferred(run(r)))
        except SystemExit as e:
            status = int(e.code or 0)
        report = box.get("report")
    except DemoError as e:
        print(f"admin_load: {e}", file=sys.stderr)
    finally:
        processes.stop()
        if status == 0:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"logs kept in {work}", file=sys.stderr)
    if report is None:
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        a, w = report["alone"], report["with_admin"]
        print(f"{args.leases:,} leases over {args.routes:,} routes, {args.usage_rows:,} usage rows")
        print(f"proxy alone:      p50 {a['p50_ms']:.2f} ms  p99 {a['p99_ms']:.2f} ms  "
              f"({a['requests']} requests, {a['errors']} errors)")  # fmt: skip
        print(f"with admin loop:  p50 {w['p50_ms']:.2f} ms  p99 {w['p99_ms']:.2f} ms  "
              f"({w['requests']} requests, {w['errors']} errors)")  # fmt: skip
        print(f"p99 rise: {report['p99_rise_ms']:.2f} ms; admin requests: "
              f"{report['admin']['requests']} ({report['admin']['bytes'] / 1e6:.1f} MB, "
              f"slowest {report['admin']['slowest_ms']:.0f} ms)")  # fmt: skip
        cpu = report["crossbar_cpu_pct"]
        print(f"crossbar: RSS {report['crossbar_rss_mib']:.0f} MiB, CPU {cpu['alone']:.0f}% "
              f"alone, {cpu['with_admin']:.0f}% with the admin loop")  # fmt: skip
    return status


if __name__ == "__main__":
    sys.exit(main())
