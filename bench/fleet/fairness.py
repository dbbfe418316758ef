"""Benchmark how routes share one host: FIFO, priority, and weights 4:1.

    .venv/bin/python bench/fleet/fairness.py [--duration 30] [--warmup 3] [--json]

Starts one `crossbar-fakellama` with 2 slots (`--tokens-per-second`, default 100, so a
16-token answer holds a slot about 160 ms) and three crossbars under twistd in front of it, one
per scenario, each with an `interactive` and a `batch` route on that host (2 slots):

- fifo:     neither route sets a queue key (one shared FIFO line: the old behaviour);
- priority: interactive has `priority = 1`;
- weights:  interactive `weight = 4`, batch `weight = 1` (admissions shared 4:1 when both wait).

The scenarios run one after another against the same fake. Load, the same in each: `--batch`
workers (default 8) send batch requests back to back, so a backlog always waits for the two
slots; `--agents` workers (default 4) act like interactive agents, each sending a request, then
thinking for an exponentially distributed time (mean `--think` seconds, seeded) before the next.
Every request is its own conversation's next turn and asks for `--tokens` tokens. After a
discarded warm-up, for `--duration` seconds, the queue wait crossbar reports for each request
(`X-Crossbar-Queue-Ms`) is collected per route (for the requests sent and answered inside the
window); printed per route and scenario: requests, requests/s, p50, p95 and max queue wait, and
the requests still open when the window closed (a starved route's are all there).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from treq.client import HTTPClient
from twisted.internet import defer, task
from twisted.web.client import Agent, HTTPConnectionPool

from bench.common.measure import percentile, react, with_processes
from crossbar.demo.launch import free_ports, start_crossbar, wait_ready
from crossbar.demo.plan import read_plan
from crossbar.demo.processes import Processes, command, wait_for_line

MODEL = "qwen-coder"
SLOTS = 2
START_SECONDS = 30.0
SCENARIOS = {
    "fifo": ({}, {}),
    "priority": ({"priority": 1}, {}),
    "weights": ({"weight": 4}, {"weight": 1}),
}  # scenario -> (interactive's keys, batch's keys)

CONFIG = """\
[server]
listen = "tcp:{listen}:interface=127.0.0.1"
admin_listen = "tcp:{admin}:interface=127.0.0.1"
db = "{db}"
health_interval = "1h"
health_timeout = "5s"
shutdown_grace = "1s"
queue_max = 256
queue_timeout = "10m"

[hosts.fake]
url = "{url}"
models = ["{model}"]
parallel = {slots}
ctx = 8192

[routes.interactive]
hosts = ["fake"]
default_model = "{model}"
{interactive}
[routes.batch]
hosts = ["fake"]
default_model = "{model}"
{batch}"""


@dataclass
class Route:
    """One route's numbers in one scenario; waits in milliseconds."""

    scenario: str
    route: str
    requests: int = 0
    open_at_end: int = 0  # sent, and not yet answered when the measured window closed
    errors: int = 0
    rps: float = 0.0
    wait_p50_ms: float = 0.0
    wait_p95_ms: float = 0.0
    wait_max_ms: float = 0.0
    waits: list[float] = field(default_factory=list, repr=False)
    first_error: str = ""


def keys(table: dict[str, Any]) -> str:
    return "".join(f"{k} = {v}\n" for k, v in table.items())


def body(who: str, turn: int, tokens: int) -> bytes:
    """The `turn`-th request of conversation `who` (its history grows like a real one's)."""
    messages: list[dict[str, str]] = [{"role": "user", "content": f"{who}: start the task."}]
    for n in range(turn):
        messages.append({"role": "assistant", "content": f"step {n} done"})
        messages.append({"role": "user", "content": f"{who}: go on with step {n + 1}."})
    return json.dumps({"model": MODEL, "max_tokens": tokens, "messages": messages}).encode()


async def run_scenario(reactor: Any, name: str, url: str, args: argparse.Namespace) -> list[Route]:
    """The load against one crossbar; per route, what its requests waited."""
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = args.batch + args.agents
    http = HTTPClient(Agent(reactor, pool=pool))
    results = {route: Route(name, route) for route in ("interactive", "batch")}
    begin = reactor.seconds()
    measure_from, end = begin + args.warmup, begin + args.warmup + args.duration
    rng = random.Random(args.seed)
    running = dict.fromkeys(results, 0)

    def close_window() -> None:
        for route, n in running.items():
            results[route].open_at_end = n

    reactor.callLater(end - begin, close_window)

    async def one(route: str, who: str, turn: int) -> None:
        result = results[route]
        started = reactor.seconds()
        running[route] += 1
        try:
            response = await http.post(
                f"{url}/r/{route}/v1/chat/completions",
                data=body(who, turn, args.tokens),
                headers={"Content-Type": "application/json"},
            )
            await response.content()
            if response.code != 200:
                raise ValueError(f"HTTP {response.code}")
            waited = float(response.headers.getRawHeaders("X-Crossbar-Queue-Ms")[0])
        except Exception as e:
            result.errors += 1
            result.first_error = result.first_error or f"{type(e).__name__}: {e}"
            return
        finally:
            running[route] -= 1
        if started >= measure_from and reactor.seconds() <= end:
            result.waits.append(waited)

    async def batch_worker(n: int) -> None:
        turn = 0
        while reactor.seconds() < end:
            await one("batch", f"batch-{n}", turn)
            turn += 1

    async def agent(n: int, think: random.Random) -> None:
        turn = 0
        while True:
            await task.deferLater(reactor, think.expovariate(1 / args.think))
            if reactor.seconds() >= end:
                return
            await one("interactive", f"agent-{n}", turn)
            turn += 1

    workers = [defer.ensureDeferred(batch_worker(n)) for n in range(args.batch)]
    workers += [
        defer.ensureDeferred(agent(n, random.Random(rng.random()))) for n in range(args.agents)
    ]
    await defer.gatherResults(workers, consumeErrors=True)
    await pool.closeCachedConnections()
    for r in results.values():
        r.requests = len(r.waits)
        r.rps = r.requests / args.duration
        r.wait_p50_ms = percentile(r.waits, 50)
        r.wait_p95_ms = percentile(r.waits, 95)
        r.wait_max_ms = max(r.waits, default=0.0)
    return list(results.values())


async def run_all(reactor: Any, urls: dict[str, str], args: argparse.Namespace) -> None:
    """Each scenario in turn, then the report."""
    rows: list[Route] = []
    for name, url in urls.items():
        progress = sys.stderr if args.json else sys.stdout
        print(f"  {name} ...", file=progress, flush=True)
        rows += await run_scenario(reactor, name, url, args)
    report(rows, args)


def report(rows: list[Route], args: argparse.Namespace) -> None:
    """The rows as a table, or as JSON."""
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k != "json"}
        print(json.dumps({"settings": settings, "rows": [asdict(r) for r in rows]}, indent=2))
        return
    head = (
        f"{'scenario':<10}{'route':<13}{'requests':>9}{'req/s':>8}"
        f"{'wait p50 ms':>13}{'wait p95 ms':>13}{'wait max ms':>13}{'open at end':>13}"
        f"{'errors':>8}"
    )
    print()
    print(head)
    print("-" * len(head))
    for r in rows:
        waits = [r.wait_p50_ms, r.wait_p95_ms, r.wait_max_ms]
        cells = "".join(f"{w:>13.0f}" if r.requests else f"{'-':>13}" for w in waits)
        print(
            f"{r.scenario:<10}{r.route:<13}{r.requests:>9}{r.rps:>8.1f}{cells}"
            f"{r.open_at_end:>13}{r.errors:>8}"
        )
    for r in rows:
        if r.first_error:
            print(f"first error of {r.scenario}/{r.route}: {r.first_error}")


def start(processes: Processes, work: Path, args: argparse.Namespace) -> dict[str, str]:
    """The fake, then one crossbar per scenario in front of it; their base URLs once ready."""
    fake = processes.start(
        "fake",
        [
            command("crossbar-fakellama"),
            *("--port", "0", "--model", MODEL, "--parallel", str(SLOTS), "--ctx", "8192"),
            *("--tokens-per-second", str(args.tokens_per_second)),
        ],
    )
    fake_url = wait_for_line(fake, r" at (http://\S+)", time.monotonic() + START_SECONDS)[1]
    urls = {}
    for name, (interactive, batch) in SCENARIOS.items():
        listen, admin = free_ports(2)
        config = work / f"{name}.toml"
        config.write_text(
            CONFIG.format(
                listen=listen,
                admin=admin,
                db=work / f"{name}.db",
                url=fake_url,
                model=MODEL,
                slots=SLOTS,
                interactive=keys(interactive),
                batch=keys(batch),
            )
        )
        plan = read_plan(config, "interactive")
        wait_ready(plan, start_crossbar(processes, config))
        urls[name] = plan.base
    return urls


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=30.0, help="measured seconds per scenario")
    p.add_argument("--warmup", type=float, default=3.0, help="discarded seconds before each")
    p.add_argument("--batch", type=int, default=8, help="batch workers, back to back")
    p.add_argument("--agents", type=int, default=4, help="interactive agents, with think time")
    p.add_argument("--think", type=float, default=1.0, help="agents' mean think time, seconds")
    p.add_argument("--tokens", type=int, default=16, help="tokens each request asks for")
    p.add_argument("--tokens-per-second", type=float, default=100.0, help="the fake's speed")
    p.add_argument("--seed", type=int, default=18, help="seed of the agents' think times")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    if min(args.batch, args.agents, args.tokens) < 1 or min(args.duration, args.think) <= 0:
        p.error("--batch, --agents and --tokens need at least 1; --duration and --think > 0")
    if args.tokens_per_second <= 0:
        p.error("--tokens-per-second must be positive (a fake that answers at once never queues)")
    return args


def main(argv: list[str] | None = None) -> int:
    """Start the processes, run the scenarios in this process's reactor, stop them."""
    args = parse_args(argv)

    def body(processes: Processes, work: Path) -> int:
        urls = start(processes, work, args)
        return react(lambda r: run_all(r, urls, args))

    return with_processes("fairness", body)


if __name__ == "__main__":
    sys.exit(main())
