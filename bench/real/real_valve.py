"""The valve (issue 37) on real llama-servers: how long turns wait, and what moving them costs
in prefill, when several busy agent conversations share one host while the others think.

    .venv/bin/python bench/real/real_valve.py [--workload overload|shape|default]
        [--routers crossbar,crossbar-novalve,vllm-router,smg,round-robin] [--runs 3]
        [--rounds 3] [--turns N] [--think 2] [--seed 37] [--max-tokens N]
        [--crossbar-python .venv/bin/python] [--crossbar-keys 'valve_margin = 1.2'] [--json]

    # a smoke run: one run of the smallest shape through the routers that need no install
    .venv/bin/python bench/real/real_valve.py --workload shape --runs 1 --rounds 1 \\
        --routers round-robin,crossbar-novalve,crossbar

The workloads (every turn the whole conversation so far plus the reply and a new user message,
as bench/real/agent_workload.py builds them; a shared ~330-token system prompt; streamed
`/v1/chat/completions` with `stream_options.include_usage`, temperature 0; `max_tokens`
`--max-tokens`: an agent's reply, 96, on overload and shape (a tool call or a patch; this model
writes to its limit, so a busy agent's turn holds its slot for seconds, as a big model's does
on a GPU box), real_cache.py's 24 on default):

- `overload` (the default): 3 llama-servers, one slot each (`-np 1 -c 8192 -t 1 --cache-ram
  512`). 9 conversations begin one at a time, so a sticky router spreads them 3/3/3 in start
  order (conversation i on host i mod 3: crossbar's chooser takes the fewest leases, then
  config order). Then `--rounds` rounds: in round r the three conversations on host r mod 3
  and one of the next host's work `--turns` turns each (default 3), all at once, thinking
  0..`--think` s (default 2, seeded by `--seed`, the same for every router) before each turn
  after their first, while the others think. Strict stickiness queues three busy agents on one
  one-slot host beside two idle ones. A run took 36 s of turns (40 s with the start) on 2
  cores with the load at 1.3: a default sitting, 5 routers x 3 runs, about 10 minutes.
- `shape`: the shape the issue measured: 2 hosts, one slot each, `--cache-ram 512`; six
  conversations begin one at a time (3/3), then `--rounds` rounds in which two conversations
  that share a host work `--turns` turns each at once while the others think.
- `default`: bench/real/real_cache.py's workload, streamed: 3 hosts `-np 2 -c 8192 -t 1 --cache-ram
  24`, 9 conversations x 5 turns (`--turns`), 3 at a time, no thinking.

The routers, each in front of fresh llama-servers (cold caches) for every run:

- `crossbar`: `twistd -n crossbar -c <config>` from `--crossbar-python`'s venv, one route over
  the hosts with the valve on (its defaults), no session header (crossbar fingerprints the
  conversation), a temporary db;
- `crossbar-novalve`: the same with `valve = false` on the route (strict stickiness);
- `vllm-router` and `smg`: `--policy cache_aware` (bench/peers/peer_routers.py installs them into
  ~/.cache/crossbar-peers on first use; one that cannot be installed is skipped, said why);
- `round-robin`: each request straight to the next host in turn (the client rotates).

Each router runs `--runs` times. Run k takes the routers in the given order (odd k) or reversed
(even k), turned by (k-1)//2 places, so no router always goes first or follows the same one.

Printed: per run and router, the load average before it, prefill tokens (the sum of
llama-server's `timings.prompt_n` from each stream's last chunk, or `usage.prompt_tokens` less
`cached_tokens` where a router strips `timings`, said so), time to first token (request sent to
the first event carrying reply text) p50 and p99 over all turns, turn seconds (to the stream's
end) p50 and p99, the wall seconds to finish every turn (think times included, the same for
every router), the lease moves crossbar's admin `/metrics` counts with reason `busy` (the
valve's; `-` for the other routers), the CPU seconds of the router and of the llama-servers,
and answered/expected turns. Then per router the median of each figure over its whole runs
(every turn answered) with the spread (min-max), figures down and routers across; the turns
each host served (counted in its log); errors. `--json` prints all of it, every turn included,
as one JSON document on stdout (the progress goes to stderr). A router whose run fails has the
error in its row; the others still run; the exit status is then 1. Every process's log is kept
in a directory printed at the start. Ports come from 23000-23999.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from prometheus_client.parser import text_string_to_metric_families
from twisted.web.client import Agent

from bench.common.measure import Reader, crossbar_checkout, percentile, react, with_processes
from bench.peers import peer_routers
from bench.real import real_cache
from bench.real.agent_workload import (
    TurnResult,
    header_host,
    round_robin,
    run_phases,
    sent_to,
    through,
)
from bench.real.valve_workloads import AGENT_REPLY, WORKLOADS, Plan, plan_of
from crossbar.demo.plan import DemoError
from crossbar.demo.processes import Processes, stop

ROUTERS = ("crossbar", "crossbar-novalve", "vllm-router", "smg", "round-robin")
PEERS = ("smg", "vllm-router")
CROSSBARS = {"crossbar": "", "crossbar-novalve": "valve = false\n"}  # the route's extra keys
PORTS = range(23000, 24000)  # this bench's share of the machine's ports
MOVE_REASON = "busy"  # the valve's lease moves
METRICS_SECONDS = 10.0


def order_of(routers: list[str], run: int) -> list[str]:
    """The routers' order in run `run` (1..N): as given in odd runs, reversed in even ones,
    turned by (run-1)//2 places."""
    base = routers if run % 2 == 1 else routers[::-1]
    k = ((run - 1) // 2) % len(base) if base else 0
    return base[k:] + base[:k]


# --- one router's run ---------------------------------------------------------------------


@dataclass
class RunRow:
    """One router's run; seconds are wall or CPU seconds, None where not measured."""

    router: str
    run: int  # 1..N
    position: int  # its place in the run's order, 1 = first
    expected: int
    load_before: tuple[float, float, float] | None = None
    answered: int = 0  # turns answered 200 with token counts
    prefill: int | None = None  # prompt tokens the hosts processed (not from cache)
    cached: int | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    turn_p50_s: float | None = None
    turn_p99_s: float | None = None
    wall_s: float | None = None
    busy_moves: int | None = None  # crossbar only: lease moves with reason `busy`
    moves: dict[str, int] | None = None  # crossbar only: every lease move, by reason
    router_cpu_s: float | None = None
    hosts_cpu_s: float | None = None
    timings_stripped: bool = False  # some answer had no `timings`: `usage` counted instead
    no_first_token: int = 0  # answered turns without a single event carrying text
    first_hosts: list[str] = field(default_factory=list)
    host_turns: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    error: str = ""  # the first error: a turn's, or why the run could not start
    turns: list[TurnResult] = field(default_factory=list)  # in --json only

    @property
    def whole(self) -> bool:
        """Every turn answered: the run counts in the medians."""
        return not self.error and self.answered == self.expected


def figures(row: RunRow, results: list[TurnResult]) -> RunRow:
    """Fill `row`'s turn figures from its results (wall, CPU and moves are the caller's)."""
    good = [r for r in results if r.status == 200 and not r.error]
    firsts = [r.ttft_s for r in good if r.ttft_s is not None]
    seconds = [r.seconds for r in good]
    failed = [r for r in results if r.error]
    row.answered = len(good)
    row.prefill = sum(r.prompt_n for r in good)
    row.cached = sum(r.cache_n for r in good)
    if firsts:
        row.ttft_p50_s, row.ttft_p99_s = percentile(firsts, 50), percentile(firsts, 99)
    if seconds:
        row.turn_p50_s, row.turn_p99_s = percentile(seconds, 50), percentile(seconds, 99)
    row.timings_stripped = any(not r.from_timings for r in good)
    row.no_first_token = len(good) - len(firsts)
    hosts = {r.conversation: r.host or "-" for r in results if r.turn == 1}
    row.first_hosts = [hosts[c] for c in sorted(hosts)]
    row.errors = len(failed)
    row.error = failed[0].error if failed else ""
    row.turns = results
    return row


def parse_moves(text: str) -> dict[str, int]:
    """crossbar's `crossbar_lease_moves_total` by reason, from its Prometheus text."""
    moves: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "crossbar_lease_moves":
            for sample in family.samples:
                if sample.name == "crossbar_lease_moves_total":
                    reason = sample.labels.get("reason", "")
                    moves[reason] = moves.get(reason, 0) + int(sample.value)
    return moves


async def lease_moves(reactor: Any, admin: str) -> dict[str, int]:
    """The lease moves crossbar's admin (base URL `admin`) counts, by reason."""
    get = Agent(reactor).request(b"GET", f"{admin}/metrics".encode())
    response = await get.addTimeout(METRICS_SECONDS, reactor)
    reader = Reader(reactor)
    response.deliverBody(reader)
    body = await reader.done.addTimeout(METRICS_SECONDS, reactor)
    if response.code != 200:
        raise DemoError(f"GET {admin}/metrics: HTTP {response.code}: {body[:200]!r}")
    return parse_moves(body.decode())


async def start_router(
    reactor: Any, sitting: real_cache.Sitting, plan: Plan, router: str
) -> real_cache.Started:
    """Fresh hosts with the plan's flags and `router` in front of them, both ready."""
    urls = await real_cache.start_hosts(reactor, sitting, router, plan.llama_args)
    hosts = sitting.processes.started[-len(urls) :]
    chat = {name: f"{url}/v1/chat/completions" for name, url in urls.items()}
    if router == "round-robin":
        straight = sent_to({c: name for name, c in chat.items()})
        return real_cache.Started(round_robin(list(chat.values())), straight, None, hosts)
    if router in CROSSBARS:
        keys = CROSSBARS[router] + (sitting.args.crossbar_keys if router == "crossbar" else "")
        process, url, admin = await real_cache.start_crossbar(reactor, sitting, urls, keys)
        names = {url: name for name, url in urls.items()}
        host_of = header_host(b"X-Crossbar-Host", names)
        return real_cache.Started(through(url), host_of, process, hosts, admin)
    return await real_cache.start_peer(reactor, sitting, router, urls, hosts)


async def run_router(
    reactor: Any, sitting: real_cache.Sitting, plan: Plan, router: str, run: int, position: int
) -> RunRow:
    """One router's run, from fresh hosts to its row; its processes stopped after."""
    out = sitting.progress
    sitting.runs += 1
    row = RunRow(router, run, position, plan.expected, load_before=os.getloadavg())
    load = " ".join(f"{x:.2f}" for x in row.load_before or ())
    print(f"run {run}, {router}: load {load}; starting {plan.hosts} llama-servers", file=out)
    try:
        started = await start_router(reactor, sitting, plan, router)
        before = real_cache.cpu_of(started)
        began = reactor.seconds()
        print(f"run {run}, {router}: {plan.expected} turns", file=out, flush=True)
        results = await run_phases(
            reactor, started.target, plan.workload, list(plan.phases), started.host_of, out
        )
        row.wall_s = reactor.seconds() - began
        after = real_cache.cpu_of(started)
        if started.admin:
            try:
                row.moves = await lease_moves(reactor, started.admin)
                row.busy_moves = row.moves.get(MOVE_REASON, 0)
            except Exception as e:  # the run still counts; its moves are unknown
                print(f"run {run}, {router}: moves unknown ({e})", file=out)
        served = {f"h{i}": real_cache.served_turns(p) for i, p in enumerate(started.hosts)}
    except (DemoError, peer_routers.PeerUnavailable) as e:
        row.errors, row.error = 1, str(e)
        return row
    finally:
        for line in stop(list(reversed(sitting.processes.started))):
            if "killed" in line:
                print(line, file=out)
        sitting.processes.started.clear()
    figures(row, results)
    row.host_turns = {name: n for name, n in served.items() if n is not None}
    if started.router is not None:
        row.router_cpu_s = after["router"] - before["router"]
    row.hosts_cpu_s = after["hosts"] - before["hosts"]
    print(
        f"run {run}, {router}: {row.answered}/{row.expected} turns in {row.wall_s:.0f} s, "
        f"prefill {row.prefill:,}",
        file=out,
    )
    return row


# --- the report ---------------------------------------------------------------------------

# (RunRow field, label, format) of each figure the tables show
FIGURES = (
    ("prefill", "prefill tokens", ",.0f"),
    ("ttft_p50_s", "TTFT p50 s", ".2f"),
    ("ttft_p99_s", "TTFT p99 s", ".2f"),
    ("turn_p50_s", "turn p50 s", ".2f"),
    ("turn_p99_s", "turn p99 s", ".2f"),
    ("wall_s", "wall s", ".1f"),
    ("busy_moves", "busy moves", ".0f"),
    ("router_cpu_s", "router cpu s", ".2f"),
    ("hosts_cpu_s", "hosts cpu s", ".1f"),
    ("answered", "answered", ".0f"),
)


@dataclass(frozen=True)
class Spread:
    """A figure over a router's whole runs."""

    median: float
    low: float
    high: float
    runs: int


def summarize_runs(rows: list[RunRow]) -> dict[str, dict[str, Spread | None]]:
    """Per router (in first-seen order), per figure: the median and min-max over its whole
    runs; None where no whole run measured it."""
    summary: dict[str, dict[str, Spread | None]] = {}
    for router in dict.fromkeys(r.router for r in rows):
        whole = [r for r in rows if r.router == router and r.whole]
        summary[router] = {}
        for name, _label, _spec in FIGURES:
            values = [getattr(r, name) for r in whole if getattr(r, name) is not None]
            summary[router][name] = (
                Spread(statistics.median(values), min(values), max(values), len(values))
                if values
                else None
            )
    return summary


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report(rows: list[RunRow], routers: list[str], expected: int, out: TextIO) -> None:
    """The runs one line each, then the medians (min-max) per router, then notes."""
    head = f"{'run':>3} {'router':<17}{'load':>6}" + "".join(
        f"{label:>{max(len(label), 8) + 2}}" for _n, label, _s in FIGURES
    )
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in rows:
        load = _num(r.load_before[0] if r.load_before else None, ".2f")
        cells = []
        for name, label, spec in FIGURES:
            text = _num(getattr(r, name), spec)
            if name == "answered":
                text = f"{r.answered}/{r.expected}"
            cells.append(f"{text:>{max(len(label), 8) + 2}}")
        print(f"{r.run:>3} {r.router:<17}{load:>6}" + "".join(cells), file=out)
    print(file=out)

    summary = summarize_runs(rows)
    shown = [r for r in routers if r in summary]
    table = [["figure", *shown]]
    table.append(
        [
            "whole runs",
            *(
                f"{sum(x.whole for x in rows if x.router == r)}/{sum(x.router == r for x in rows)}"
                for r in shown
            ),
        ]
    )
    for name, label, spec in FIGURES:
        line = [label]
        for router in shown:
            s = summary[router][name]
            if s is None:
                line.append("-")
            elif s.runs == 1 or s.low == s.high:
                line.append(format(s.median, spec))
            else:
                line.append(f"{format(s.median, spec)} ({format(s.low, spec)}-{s.high:{spec}})")
            if name == "answered" and s is not None:
                line[-1] += f" of {expected}"
        table.append(line)
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    print("median (min-max) over each router's whole runs", file=out)
    for i, line in enumerate(table):
        rest = zip(line[1:], widths[1:], strict=True)
        cells = [line[0].ljust(widths[0])] + [c.rjust(w) for c, w in rest]
        print("  ".join(cells), file=out)
        if i == 0:
            print("-" * (sum(widths) + 2 * (len(widths) - 1)), file=out)
    print(file=out)
    for r in rows:
        if r.host_turns:
            each = ", ".join(f"{name} {n}" for name, n in r.host_turns.items())
            firsts = " ".join(r.first_hosts)
            print(
                f"run {r.run}, {r.router}: turns per host (their logs) {each}; "
                f"first turns went to {firsts}",
                file=out,
            )
        if r.moves:
            each = ", ".join(f"{reason} {n}" for reason, n in sorted(r.moves.items()))
            print(f"run {r.run}, {r.router}: lease moves {each}", file=out)
        if r.timings_stripped:
            print(f"run {r.run}, {r.router}: answers without `timings`: from `usage`", file=out)
        if r.no_first_token:
            print(f"run {r.run}, {r.router}: {r.no_first_token} turns without text", file=out)
        if r.error:
            print(f"run {r.run}, {r.router}: {r.errors} error(s), the first: {r.error}", file=out)


# --- the sitting --------------------------------------------------------------------------


async def run_sitting(reactor: Any, sitting: real_cache.Sitting, plan: Plan) -> None:
    """Every run of every chosen router, then the tables; exit status 1 if any run failed."""
    args, out = sitting.args, sitting.progress
    stopping: list[bool] = []  # Ctrl-C or SIGTERM: the reactor is on its way out
    reactor.addSystemEventTrigger("before", "shutdown", stopping.append, True)
    routers = [r for r in args.routers if r not in sitting.skipped]
    rows: list[RunRow] = []
    orders: list[list[str]] = []
    for run in range(1, args.runs + 1):
        order = order_of(routers, run)
        orders.append(order)
        print(f"run {run} of {args.runs}: {', '.join(order)}", file=out, flush=True)
        for position, router in enumerate(order, 1):
            if stopping:
                break
            rows.append(await run_router(reactor, sitting, plan, router, run, position))
    if stopping:
        print("interrupted: the runs after the last row were not run", file=out)
    if args.json:
        summary = summarize_runs(rows)
        document = {
            "workload": {
                "name": plan.name,
                "hosts": plan.hosts,
                "llama_args": plan.llama_args,
                "conversations": plan.conversations,
                "turns": plan.expected,
                "max_tokens": plan.workload.max_tokens,
                "phases": [asdict(p) for p in plan.phases],
                "seed": args.seed,
            },
            "runs": args.runs,
            "orders": orders,
            "skipped": sitting.skipped,
            "load_before_sitting": sitting.load_before,
            "crossbar": args.crossbar_checkout,
            "logs": str(sitting.work),
            "rows": [asdict(r) for r in rows],
            "summary": {
                router: {k: None if s is None else asdict(s) for k, s in figures_.items()}
                for router, figures_ in summary.items()
            },
        }
        print(json.dumps(document, indent=2))
    else:
        print(file=out)
        report(rows, routers, plan.expected, out)
        for name, reason in sitting.skipped.items():
            print(f"{name}: skipped ({reason})", file=out)
    if any(r.error for r in rows) or stopping:
        raise SystemExit(1)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; `--routers` is a comma-separated list of ROUTERS."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workload", choices=WORKLOADS, default="overload")
    p.add_argument("--routers", default=",".join(ROUTERS), help="comma-separated, of: %(default)s")
    p.add_argument("--runs", type=int, default=3, help="runs of each router")
    p.add_argument("--rounds", type=int, default=3, help="overload and shape: busy rounds")
    p.add_argument(
        "--turns",
        type=int,
        default=None,
        help="overload and shape: turns each busy conversation works a round (3);\n"
        "default: turns per conversation (5)",
    )
    p.add_argument(
        "--think", type=float, default=2.0, help="overload and shape: most think seconds"
    )
    p.add_argument("--seed", type=int, default=37, help="of the think times")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help=f"each reply's limit (overload and shape: {AGENT_REPLY}; default: 24)",
    )
    p.add_argument(
        "--crossbar-python",
        default=sys.executable,
        help="the Python of the venv whose twistd runs crossbar (default: this one)",
    )
    p.add_argument(
        "--crossbar-keys",
        default="",
        help="TOML lines added to the `crossbar` router's route, to tune the valve\n"
        "(e.g. 'valve_margin = 1.2'; `crossbar-novalve` never gets them)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of the tables")
    args = p.parse_args(argv)
    if args.crossbar_keys and not args.crossbar_keys.endswith("\n"):
        args.crossbar_keys += "\n"
    args.routers = list(dict.fromkeys(r.strip() for r in args.routers.split(",") if r.strip()))
    unknown = sorted(set(args.routers) - set(ROUTERS))
    if unknown or not args.routers:
        p.error(f"--routers: unknown {', '.join(unknown) or '(none given)'}; known: {ROUTERS}")
    if min(args.runs, args.rounds, 1 if args.turns is None else args.turns) < 1 or args.think < 0:
        p.error("--runs, --rounds and --turns must be at least 1, --think not negative")
    args.llama_server = os.environ.get("LLAMA_SERVER") or str(real_cache.LLAMA_SERVER)
    args.llama_model = os.environ.get("LLAMA_MODEL") or str(real_cache.LLAMA_MODEL)
    for what, path in (("LLAMA_SERVER", args.llama_server), ("LLAMA_MODEL", args.llama_model)):
        if not Path(path).is_file():
            p.error(f"{what}: no {path} (run `make real`, or set {what})")
    wants_crossbar = any(r in CROSSBARS for r in args.routers)
    if wants_crossbar and not (Path(args.crossbar_python).parent / "twistd").exists():
        p.error(f"--crossbar-python: no twistd beside {args.crossbar_python}")
    args.crossbar_checkout = crossbar_checkout(args.crossbar_python) if wants_crossbar else None
    return args


def main(argv: list[str] | None = None) -> int:
    """Install the peers asked for, then run one sitting in this process's reactor."""
    args = parse_args(argv)
    plan = plan_of(args.workload, args.rounds, args.turns, args.think, args.seed, args.max_tokens)
    args.hosts = plan.hosts  # what real_cache.start_hosts starts
    out = sys.stderr if args.json else sys.stdout
    load_before = os.getloadavg()
    skipped = peer_routers.install_all([r for r in args.routers if r in PEERS], out)
    load = " ".join(f"{x:.2f}" for x in load_before)
    print(f"load average before: {load}; {os.cpu_count()} cores", file=out)
    print(
        f"workload {plan.name}: {plan.hosts} hosts ({' '.join(plan.llama_args)}), "
        f"{plan.conversations} conversations, {plan.expected} turns in "
        f"{len(plan.phases)} phases; {args.runs} run(s) of each router",
        file=out,
    )
    if args.crossbar_checkout is not None:
        print(f"crossbar from {args.crossbar_checkout}", file=out)

    def body(processes: Processes, work: Path) -> int:
        print(f"logs of every process in {work}", file=out, flush=True)
        sitting = real_cache.Sitting(
            args, processes, work, out, skipped, load_before, real_cache.PortPicker(PORTS)
        )
        began = time.monotonic()
        status = react(lambda reactor: run_sitting(reactor, sitting, plan))
        print(f"the sitting took {time.monotonic() - began:.0f} s", file=out)
        return status

    return with_processes("real-valve", body, keep=True)


if __name__ == "__main__":
    sys.exit(main())
