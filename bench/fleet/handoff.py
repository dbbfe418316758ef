"""Benchmark rebalance: a skewed fleet with rebalance off, then on.

    .venv/bin/python bench/fleet/handoff.py [--conversations 24] [--duration 60] [--json]

Starts, per scenario, three `crossbar-fakellama` hosts (`--parallel` slots each, a prefill
cost of `--prefill-ms` per uncached prompt token, `--tokens-per-second`, `--cache-slots` idle
prompt caches kept besides the slots, as llama-server's `--cache-ram` holds a few) and one
crossbar under twistd in front of them, with
the hand-off store on (`handoff_store = "256MiB"`) and one route over the three hosts:
`rebalance = false` in the first scenario, `rebalance = true` (with `rebalance_after`,
`rebalance_idle` and `rebalance_per_minute` from the command line) in the second.

Skewed start: half of `--conversations` are placed on the first host (the two others drained
through the admin API while their first turn is made), the other half on the two other hosts.
Then each conversation acts like a coding agent: it thinks for an exponentially distributed
time (mean `--think` seconds, seeded), sends its next turn (its whole history, streamed, a
reply of `--tokens` tokens), and so on for `--warmup` + `--duration` seconds. Measured per
scenario: time to first token (the first SSE event) of every turn sent after the warm-up, p50
and p95; the prompt tokens the three
hosts prefilled in all (from the fakes' counters: prewarms included), and the moves
(`crossbar_lease_moves_total{reason="rebalance"}`).
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

import treq
from treq.client import HTTPClient
from twisted.internet import defer, task
from twisted.web.client import Agent, HTTPConnectionPool

from bench.common.measure import percentile, react, with_processes
from crossbar.demo.launch import free_ports, start_crossbar, wait_ready
from crossbar.demo.plan import read_plan
from crossbar.demo.processes import Processes, command, wait_for_line

MODEL = "qwen-coder"
START_SECONDS = 30.0
HOSTS = ("h1", "h2", "h3")

CONFIG = """\
[server]
listen = "tcp:{listen}:interface=127.0.0.1"
admin_listen = "tcp:{admin}:interface=127.0.0.1"
db = "{db}"
health_interval = "1h"
shutdown_grace = "1s"
queue_max = 256
queue_timeout = "10m"
handoff_store = "256MiB"

{hosts}
[routes.agents]
hosts = ["h1", "h2", "h3"]
default_model = "{model}"
rebalance = {rebalance}
rebalance_after = "{after}"
rebalance_idle = "{idle}"
rebalance_per_minute = {per_minute}
"""


@dataclass
class Scenario:
    """One scenario's numbers; times in milliseconds."""

    name: str
    turns: int = 0
    errors: int = 0
    ttft_p50_ms: float = 0.0
    ttft_p95_ms: float = 0.0
    prefill_tokens: int = 0
    moves: int = 0
    first_error: str = ""
    ttfts: list[float] = field(default_factory=list, repr=False)


def opening(n: int) -> str:
    """Conversation `n`'s first message: a task with some context, its own."""
    return f"Agent {n}: fix the failing test. " + " ".join(f"ctx{n}-{i}" for i in range(300))


class Conversation:
    """One agent's history; `body` is its next turn."""

    def __init__(self, n: int, tokens: int) -> None:
        self.n = n
        self.tokens = tokens
        self.messages: list[dict[str, str]] = [{"role": "user", "content": opening(n)}]

    def body(self) -> bytes:
        return json.dumps(
            {"model": MODEL, "max_tokens": self.tokens, "stream": True, "messages": self.messages}
        ).encode()

    def answered(self, turn: int) -> None:
        words = " ".join(f"out{self.n}-{turn}-{i}" for i in range(self.tokens))
        self.messages.append({"role": "assistant", "content": words})
        self.messages.append({"role": "user", "content": f"Tool output {turn}: " + words})


async def send(reactor: Any, http: HTTPClient, url: str, c: Conversation) -> float:
    """One streamed turn; returns seconds to its first SSE event."""
    started = reactor.seconds()
    first: list[float] = []
    response = await http.post(
        f"{url}/r/agents/v1/chat/completions",
        data=c.body(),
        headers={"Content-Type": "application/json"},
    )

    def chunk(data: bytes) -> None:
        if not first and b"data:" in data:
            first.append(reactor.seconds())

    await treq.collect(response, chunk)
    if response.code != 200:
        raise ValueError(f"HTTP {response.code}")
    return (first[0] if first else reactor.seconds()) - started


async def admin(http: HTTPClient, base: str, method: str, path: str) -> Any:
    response = await http.request(method, base + path)
    return json.loads(await response.content())


async def run_scenario(reactor: Any, s: dict[str, Any], args: argparse.Namespace) -> Scenario:
    """Place the conversations skewed, run the agents, read the counters."""
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = args.conversations + 4
    http = HTTPClient(Agent(reactor, pool=pool))
    result = Scenario(s["name"])
    url, base = s["url"], s["admin"]
    conversations = [Conversation(n, args.tokens) for n in range(args.conversations)]
    half = args.conversations // 2
    # Half on h1 (the others drained meanwhile), the rest spread over h2 and h3.
    for drained, group in ((("h2", "h3"), conversations[:half]), (("h1",), conversations[half:])):
        for h in drained:
            await admin(http, base, "POST", f"/api/hosts/{h}/drain")
        for c in group:
            await send(reactor, http, url, c)
            c.answered(0)
        for h in drained:
            await admin(http, base, "DELETE", f"/api/hosts/{h}/drain")
    before = await prefilled(http, s["fakes"])
    measure_from = reactor.seconds() + args.warmup
    end = measure_from + args.duration
    rng = random.Random(args.seed)

    async def agent(c: Conversation, think: random.Random) -> None:
        turn = 1
        while True:
            await task.deferLater(reactor, think.expovariate(1 / args.think))
            if reactor.seconds() >= end:
                return
            try:
                sent = reactor.seconds()
                ttft = await send(reactor, http, url, c) * 1000
                if sent >= measure_from:
                    result.ttfts.append(ttft)
            except Exception as e:
                result.errors += 1
                result.first_error = result.first_error or f"{type(e).__name__}: {e}"
                return
            c.answered(turn)
            turn += 1

    agents = [defer.ensureDeferred(agent(c, random.Random(rng.random()))) for c in conversations]
    await defer.gatherResults(agents, consumeErrors=True)
    result.prefill_tokens = await prefilled(http, s["fakes"]) - before
    metrics = (await (await http.get(base + "/metrics")).content()).decode()
    for line in metrics.splitlines():
        if line.startswith('crossbar_lease_moves_total{reason="rebalance"}'):
            result.moves = int(float(line.split()[-1]))
    await pool.closeCachedConnections()
    result.turns = len(result.ttfts)
    result.ttft_p50_ms = percentile(result.ttfts, 50)
    result.ttft_p95_ms = percentile(result.ttfts, 95)
    return result


async def prefilled(http: HTTPClient, fakes: list[str]) -> int:
    """Prompt tokens the fakes processed so far (not taken from a cache)."""
    total = 0
    for fake in fakes:
        counters = json.loads(await (await http.get(fake + "/_fake/counters")).content())
        total += counters["prefill_tokens"]
    return int(total)


async def run_all(reactor: Any, scenarios: list[dict[str, Any]], args: argparse.Namespace) -> None:
    rows = []
    for s in scenarios:
        print(f"  rebalance {s['name']} ...", file=sys.stderr, flush=True)
        rows.append(await run_scenario(reactor, s, args))
    report(rows, args)


def report(rows: list[Scenario], args: argparse.Namespace) -> None:
    """The rows as a table, or as JSON."""
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k != "json"}
        print(json.dumps({"settings": settings, "rows": [asdict(r) for r in rows]}, indent=2))
        return
    head = (
        f"{'rebalance':<11}{'turns':>7}{'TTFT p50 ms':>13}{'TTFT p95 ms':>13}"
        f"{'prefill tokens':>16}{'moves':>7}{'errors':>8}"
    )
    print()
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r.name:<11}{r.turns:>7}{r.ttft_p50_ms:>13.0f}{r.ttft_p95_ms:>13.0f}"
            f"{r.prefill_tokens:>16}{r.moves:>7}{r.errors:>8}"
        )
    if len(rows) == 2 and rows[1].ttft_p95_ms and rows[0].prefill_tokens:
        print(
            f"\np95 TTFT {rows[0].ttft_p95_ms / rows[1].ttft_p95_ms:.1f}x lower with rebalance; "
            f"prefill {100 * (rows[1].prefill_tokens / rows[0].prefill_tokens - 1):+.1f}%"
        )
    for r in rows:
        if r.first_error:
            print(f"first error with rebalance {r.name}: {r.first_error}")


def start(processes: Processes, work: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per scenario, three fakes and a crossbar in front of them; their URLs once ready."""
    scenarios = []
    for name, rebalance in (("off", "false"), ("on", "true")):
        fakes, tables = [], []
        for h in HOSTS:
            fake = processes.start(
                f"{name}-{h}",
                [
                    command("crossbar-fakellama"),
                    *("--port", "0", "--model", MODEL, "--parallel", str(args.parallel)),
                    *("--ctx", "65536", "--cache-slots", str(args.cache_slots)),
                    *("--tokens-per-second", str(args.tokens_per_second)),
                    *("--prefill-ms-per-token", str(args.prefill_ms)),
                ],
            )
            fake_url = wait_for_line(fake, r" at (http://\S+)", time.monotonic() + START_SECONDS)[1]
            fakes.append(fake_url)
            tables.append(f'[hosts.{h}]\nurl = "{fake_url}"\nmodels = ["{MODEL}"]\n')
        listen, admin_port = free_ports(2)
        config = work / f"{name}.toml"
        config.write_text(
            CONFIG.format(
                listen=listen,
                admin=admin_port,
                db=work / f"{name}.db",
                hosts="\n".join(tables),
                model=MODEL,
                rebalance=rebalance,
                after=args.rebalance_after,
                idle=args.rebalance_idle,
                per_minute=args.per_minute,
            )
        )
        plan = read_plan(config, "agents")
        wait_ready(plan, start_crossbar(processes, config))
        admin = f"http://127.0.0.1:{admin_port}"
        scenarios.append({"name": name, "url": plan.base, "admin": admin, "fakes": fakes})
    return scenarios


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--conversations", type=int, default=24, help="agents, half on one host")
    p.add_argument("--duration", type=float, default=60.0, help="measured seconds per scenario")
    p.add_argument("--warmup", type=float, default=10.0, help="unmeasured seconds before it")
    p.add_argument("--cache-slots", type=int, default=8, help="idle prompt caches per host")
    p.add_argument("--think", type=float, default=1.5, help="agents' mean think time, seconds")
    p.add_argument("--tokens", type=int, default=24, help="tokens each reply has")
    p.add_argument("--parallel", type=int, default=2, help="slots per host")
    p.add_argument("--tokens-per-second", type=float, default=100.0, help="the fakes' speed")
    p.add_argument("--prefill-ms", type=float, default=0.5, help="ms per uncached prompt token")
    p.add_argument("--rebalance-after", default="3s", help="rebalance_after of the on scenario")
    p.add_argument("--rebalance-idle", default="500ms", help="rebalance_idle of the on scenario")
    p.add_argument("--per-minute", type=int, default=30, help="rebalance_per_minute")
    p.add_argument("--seed", type=int, default=15, help="seed of the agents' think times")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    if args.conversations < 4 or min(args.duration, args.think, args.tokens) <= 0:
        p.error("--conversations needs at least 4; --duration, --think, --tokens above 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Start the processes, run the scenarios in this process's reactor, stop them."""
    args = parse_args(argv)

    def body(processes: Processes, work: Path) -> int:
        scenarios = start(processes, work, args)
        return react(lambda r: run_all(r, scenarios, args))

    return with_processes("handoff", body)


if __name__ == "__main__":
    sys.exit(main())
