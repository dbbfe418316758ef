"""Does the admin side stall the data path? Proxy latency with a fleet's lease table, alone and
while a client refreshes as the dashboard does, every 3 s and back to back.

    .venv/bin/python bench/fleet/admin_load.py [--leases 100000] [--routes 1000]
        [--usage-rows 100000] [--duration 5] [--concurrency 4] [--every 3] [--json]

Writes a store (SQLite) holding `--leases` conversations over `--routes` template routes
(`team-*`) and `--usage-rows` usage rows of the last hour, starts `crossbar-fakellama` and
crossbar under twistd on it (crossbar loads the leases at start), then runs `--concurrency`
chat workers against one route for `--duration` seconds three times: alone, then while an
admin client refreshes as the dashboard does (status, hosts, a page of routes and of leases,
a lease page filtered by host, the top tables, the chart, events, instances, and /metrics;
every request of a refresh at once): first every `--every` seconds (the dashboard's 3 s),
then back to back. Prints the proxy's p50/p99 in each run, the p99 rise, the admin requests
done, and crossbar's RSS and CPU; last, crossbar's CPU per dashboard request, each asked
`--cpu-requests` times in turn with nothing else running.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from twisted.internet import defer, task, utils
from twisted.web.client import Agent, HTTPConnectionPool

from bench.common.measure import Reader, cpu_seconds, percentile, react, with_processes
from bench.proxy.overhead import MODEL, chat_body, one_request
from crossbar.demo.launch import free_ports, wait_ready
from crossbar.demo.plan import read_plan
from crossbar.demo.processes import Processes, command, wait_for_line
from crossbar.store.backends import SQLITE
from crossbar.store.rollups import roll_up
from crossbar.store.setup import migrate

ROUTE = "bench"
DASHBOARD = [  # what one refresh of the dashboard asks, plus a Prometheus scrape
    "/api/status",
    "/api/hosts",
    "/api/routes?limit=20",
    "/api/leases?limit=50",
    "/api/leases?limit=50&host=fake",  # a filter
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
    """The store crossbar starts on: the fleet's leases and an hour of usage, written by SQL,
    summed per minute up to five minutes ago."""
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
    # As the sweep of a crossbar that has been running would have: the minutes older than
    # ROLLUP_LAG summed (raw rows are kept usage_raw_retention, 48 h).
    while not roll_up(conn.cursor(), SQLITE, now, raw_before=now - 48 * 3600).caught_up:
        conn.execute("COMMIT")
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


async def admin_loop(reactor: Any, base: str, every: float, seconds: float) -> dict[str, Any]:
    """Refresh as the dashboard does until `stop[0]`: every request of a refresh at once (six
    connections, as a browser), the next refresh `every` seconds after the last began (at
    once when 0: back to back), for `seconds`; count requests and bytes, note the slowest."""
    done: dict[str, Any] = {"requests": 0, "refreshes": 0, "bytes": 0, "slowest_ms": 0.0}
    end = reactor.seconds() + seconds
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = 6
    agent = Agent(reactor, pool=pool)

    async def fetch(path: str) -> None:
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

    while reactor.seconds() < end:
        began = reactor.seconds()
        await defer.gatherResults([defer.ensureDeferred(fetch(p)) for p in DASHBOARD])
        done["refreshes"] += 1
        wait = min(began + every, end) - reactor.seconds()
        if wait > 0:
            await task.deferLater(reactor, wait, lambda: None)
    await pool.closeCachedConnections()
    return done


async def cpu_per_request(reactor: Any, base: str, pid: int, n: int) -> dict[str, float]:
    """Crossbar's CPU (ms, both threads) per dashboard request, each asked `n` times in turn
    with nothing else running; and a whole refresh's sum."""
    agent = Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=True))
    out: dict[str, float] = {}
    for path in DASHBOARD:
        before = cpu_seconds(pid)
        for _ in range(n):
            response = await agent.request(b"GET", (base + path).encode())
            reader = Reader(reactor)
            response.deliverBody(reader)
            await reader.done
        out[path] = round((cpu_seconds(pid) - before) * 1000 / n, 1)
    out["a whole refresh"] = round(sum(out.values()), 1)
    return out


async def measure(reactor: Any, args: argparse.Namespace, urls: dict[str, str], pid: int) -> dict:
    """The proxy alone, beside a dashboard refreshing every `--every` s, and beside one
    refreshing back to back; crossbar's memory and CPU in each."""
    await proxy_run(reactor, urls["proxy"], args.concurrency, 1.0)  # warm up
    cpu = [cpu_seconds(pid)]
    alone = await proxy_run(reactor, urls["proxy"], args.concurrency, args.duration)
    cpu.append(cpu_seconds(pid))
    runs: dict[str, Any] = {}
    for name, every in (("dashboard", args.every), ("back_to_back", 0.0)):
        # The dashboard is another process, as a browser is: its reading of the answers must
        # not slow this process's measuring of the proxy.
        argv = [__file__, "--admin-loop", urls["admin"], "--every", str(every)]
        argv += ["--duration", str(args.duration)]
        child = utils.getProcessOutput(sys.executable, argv, env=os.environ, errortoo=False)
        loaded = await proxy_run(reactor, urls["proxy"], args.concurrency, args.duration)
        cpu.append(cpu_seconds(pid))
        loaded["p99_rise_ms"] = loaded["p99_ms"] - alone["p99_ms"]
        loaded["admin"] = json.loads(await child)
        runs[name] = loaded
    cpu_ms = await cpu_per_request(reactor, urls["admin"], pid, args.cpu_requests)
    return {
        "cpu_ms_per_admin_request": cpu_ms,
        "leases": args.leases,
        "routes": args.routes,
        "usage_rows": args.usage_rows,
        "every_s": args.every,
        "alone": alone,
        **runs,
        "crossbar_rss_mib": _rss_mib(pid),
        "crossbar_cpu_pct": {
            name: 100 * (b - a) / args.duration
            for name, a, b in zip(
                ("alone", "dashboard", "back_to_back"), cpu[:-1], cpu[1:], strict=True
            )
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
    p.add_argument("--every", type=float, default=3.0, help="seconds between refreshes")
    p.add_argument("--cpu-requests", type=int, default=10, help="times each request is timed")
    p.add_argument("--json", action="store_true", help="print JSON instead of lines")
    p.add_argument("--admin-loop", metavar="URL", help=argparse.SUPPRESS)  # the child
    args = p.parse_args(argv)
    if args.admin_loop:

        async def refresh(reactor: Any) -> None:
            print(json.dumps(await admin_loop(reactor, args.admin_loop, args.every, args.duration)))

        return react(refresh)
    box: dict[str, Any] = {}

    def body(processes: Processes, work: Path) -> int:
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

        async def run(reactor: Any) -> None:
            box["report"] = await measure(reactor, args, urls, proxy.pid)

        return react(run)

    status = with_processes("admin-load", body)
    report = box.get("report")
    if report is None:
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{args.leases:,} leases over {args.routes:,} routes, {args.usage_rows:,} usage rows")
        cpu = report["crossbar_cpu_pct"]
        for name in ("alone", "dashboard", "back_to_back"):
            r = report[name]
            print(f"{name:13s} p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  "
                  f"({r['requests']} requests, {r['errors']} errors; crossbar CPU "
                  f"{cpu[name]:.0f}%)")  # fmt: skip
            if name != "alone":
                a = r["admin"]
                print(f"{'':13s} p99 rise {r['p99_rise_ms']:.2f} ms; {a['refreshes']} refreshes, "
                      f"{a['requests']} admin requests ({a['bytes'] / 1e6:.1f} MB, slowest "
                      f"{a['slowest_ms']:.0f} ms)")  # fmt: skip
        print(f"crossbar RSS {report['crossbar_rss_mib']:.0f} MiB; CPU per admin request:")
        for path, ms in report["cpu_ms_per_admin_request"].items():
            print(f"  {ms:7.1f} ms  {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
