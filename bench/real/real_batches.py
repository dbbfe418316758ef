"""The Batch API (issue 49) on real llama-servers: how fast a batch of chat completions gets done
alone and while agents work beside it, what the agents wait meanwhile, against the thread-pool
script people write without a Batch API.

    .venv/bin/python bench/real/real_batches.py [--items 1000] [--runs 3]
        [--layouts agents-alone,batch-alone,batch-agents,pool-agents] [--agent-turns 5]
        [--pool-threads 8] [--interleave] [--crossbar-python .venv/bin/python] [--json]

A smoke of it (minutes): `--items 40 --runs 1`.

Each run starts 2 llama-servers afresh (`-np 2 -c 8192 -t 1 --cache-ram 24 --no-repack`;
LLAMA_SERVER and LLAMA_MODEL, else `make real`'s build) and crossbar (`twistd -n crossbar` from
`--crossbar-python`'s venv, importing this checkout: its PYTHONPATH starts with the checkout
this file is in) in front of them, as real_classes.py does; one route serves everything. The
workload:

- the batch: `--items` chat completions (`max_tokens` 32, temperature 0), each under one of 4
  shared system prompts (realistic instructions; 350-420 prompt tokens an item in all) with a
  short user message of its own, the items in 4 blocks of one prompt each (a job file written
  task by task; `--interleave`: the prompts taken in turn, which at `--cache-ram 24`, room for
  one prompt's cache entry a host, re-reads the whole prompt for nearly every item); sent with
  the official `openai` client as a client of the Batch API does: `files.create` (one JSONL
  file), `batches.create`, `batches.retrieve` every 0.5 s until the batch has ended,
  `files.content` of its output; crossbar runs the items at class batch;
- the agents: real_classes.py's, 3 conversations at once of `--agent-turns` streamed turns (32
  tokens) thinking 0.5 s between two, unmarked (class standard);
- the pool: the batch's requests sent by the script people write today, a ThreadPoolExecutor of
  `--pool-threads` threads calling `chat.completions.create` at crossbar, unmarked (standard).

The layouts, each from fresh hosts and crossbar:

- `agents-alone`: the agents, nothing else (the floor);
- `batch-alone`: the batch, nothing else;
- `batch-agents`: the batch, and once its first item is done the agents beside it;
- `pool-agents`: the pool, and once its first answer is in the agents beside it.

Printed per layout over `--runs` runs (the layouts' order reversed every other run), each the
median of the runs with their range: the agents' time to first token p50 and p99 over their
later turns (2 on) and the p99 over agents-alone's; the batch's (or pool's) output tokens a
second over its wall (create to the poll that saw it ended; the pool's first request to its last
answer); its output tokens a second while the agents ran (the batch's `usage.output_tokens`
read by `batches.retrieve` as the agents begin and as they end; the pool's answers that came in
between) and that over batch-alone's tokens a second; the items failed, the agents' turns
failed, the batch requests crossbar stopped for a turn and sent again
(`crossbar_batch_stopped_total`, `batch_yield_after`); crossbar's CPU seconds (the agents'
requests too) and CPU milliseconds per item. Then issue 49's targets, met or not: the agents'
TTFT p99 beside the batch at most 1.5 times alone, the batch's tokens a second while the agents
run at least 0.7 of alone. A batch or pool that ends before the agents do (too few `--items`
for the agents' length) has its rate beside them taken over their overlap, and says so. Logs
of every process are kept in a directory printed at the start. Ports come from 24000-24999.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import openai
from twisted.internet.threads import deferToThread
from twisted.web.client import Agent

from bench.common.measure import (
    PortPicker,
    Reader,
    cpu_seconds,
    crossbar_checkout,
    react,
    with_processes,
)
from bench.real.batch_clients import (
    Job,
    Sample,
    Started,
    batch_job,
    client,
    pool_job,
    sample_of,
)
from bench.real.batch_workload import ITEM_TOKENS, SYSTEMS
from bench.real.real_classes import (
    AGENT_TOKENS,
    AGENTS,
    THINK,
    TURNS,
    agent_times,
    llama_paths,
    run_agents,
    start_fleet,
)
from bench.real.real_models import HOSTS, Sitting, spread
from crossbar.demo.plan import DemoError
from crossbar.demo.processes import stop

LAYOUTS = ("agents-alone", "batch-alone", "batch-agents", "pool-agents")
WITH_AGENTS = ("agents-alone", "batch-agents", "pool-agents")
PORTS = range(24000, 25000)
CHECKOUT = Path(__file__).resolve().parents[2]  # the crossbar this bench runs
ITEMS, POOL_THREADS = 1000, 8
ANSWER_SECONDS = 300.0  # one item's answer for the pool, on a busy 2-core machine
TTFT_TARGET, RATE_TARGET = 1.5, 0.7  # issue 49's


@dataclass
class Run:
    """One layout's numbers in one run."""

    layout: str
    items: int = 0
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    turn_p99_s: float | None = None
    failed_turns: int = 0
    wall_s: float | None = None  # the batch's or the pool's
    output_tokens: int = 0
    tokens_per_s: float | None = None
    agents_s: float | None = None  # how long the agents ran beside it
    beside_tokens: int | None = None  # output tokens done while they ran
    beside_tokens_per_s: float | None = None
    failed_items: int = 0
    stopped: int | None = None  # batch requests stopped for a turn (crossbar_batch_stopped_total)
    error: str = ""
    note: str = ""
    crossbar_cpu_s: float = 0.0
    load_before: float = 0.0
    samples: list[dict[str, Any]] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)

    @property
    def cpu_ms_per_item(self) -> float | None:
        return 1000 * self.crossbar_cpu_s / self.items if self.items else None


async def retrieve(oai: openai.OpenAI, batch_id: str) -> Sample:
    return sample_of(await deferToThread(oai.batches.retrieve, batch_id))


def admin_port(config: Path) -> str:
    """The admin port of crossbar run with `config` (start_fleet's)."""
    return str(tomllib.loads(config.read_text())["server"]["admin_listen"].split(":")[1])


async def stopped_total(reactor: Any, admin: str) -> int | None:
    """crossbar_batch_stopped_total (all hosts) from crossbar's admin port; None if it cannot
    be read."""
    try:
        url = f"http://127.0.0.1:{admin}/metrics".encode()
        response = await Agent(reactor).request(b"GET", url).addTimeout(10, reactor)
        reader = Reader(reactor)
        response.deliverBody(reader)
        text = (await reader.done.addTimeout(10, reactor)).decode()
    except Exception:
        return None
    name = "crossbar_batch_stopped_total"
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith((name + "{", name + " "))))  # fmt: skip


async def run_one(reactor: Any, sitting: Sitting, layout: str) -> Run:
    """One layout's run, from fresh hosts; its processes stopped after."""
    args, out = sitting.args, sitting.progress
    sitting.runs += 1
    label = f"{sitting.runs:02d}-{layout}"
    run = Run(layout, load_before=os.getloadavg()[0])
    print(f"{label}: starting (load {run.load_before:.2f})", file=out, flush=True)
    halt, work, job = threading.Event(), None, Job(args.items, args.interleave, args.max_tokens)
    began = ended = 0.0
    try:
        agents_url, _, process = await start_fleet(reactor, sitting, layout, label)
        oai = client(agents_url.removesuffix("/chat/completions"), ANSWER_SECONDS)
        before = cpu_seconds(process.pid)
        started = Started(reactor)
        if layout.startswith("batch"):
            work = deferToThread(batch_job, oai, job, halt, started)
        elif layout.startswith("pool"):
            work = deferToThread(pool_job, oai, job, args.pool_threads, halt, started)
        if work is not None:
            run.items = args.items
            await started.ready
        if layout in WITH_AGENTS:
            batch_id = job.batch_id if layout == "batch-agents" and not work.called else ""
            if batch_id:
                first = await retrieve(oai, batch_id)
            began = reactor.seconds()
            print(f"{label}: agents begin", file=out, flush=True)
            results = await run_agents(reactor, agents_url, args.agent_turns)
            ended = reactor.seconds()
            run.ttft_p50_s, run.ttft_p99_s, run.turn_p99_s = agent_times(results)
            run.failed_turns = sum(1 for r in results if r.error)
            run.error = next((r.error for r in results if r.error), "")
            run.turns = [asdict(r) for r in results]
            run.agents_s = ended - began
            if batch_id:
                last = await retrieve(oai, batch_id)
                if last.completed + last.failed >= args.items:  # the batch ended first
                    ends = (x for x in job.samples if x.completed + x.failed >= args.items)
                    last = next(ends, last)
                    run.note = "the batch ended before the agents: its rate over their overlap"
                if last.at > first.at:
                    run.beside_tokens = last.output_tokens - first.output_tokens
                    run.beside_tokens_per_s = run.beside_tokens / (last.at - first.at)
        if work is not None:
            if layout in WITH_AGENTS and not args.whole:
                halt.set()  # its rate beside the agents is measured: the rest is not needed
            await work
            if layout == "pool-agents" and run.agents_s is not None and job.answers:
                end = min(ended, max(at for at, _ in job.answers))
                if end < ended:
                    run.note = "the pool ended before the agents: its rate over their overlap"
                if end > began:
                    run.beside_tokens = sum(t for at, t in job.answers if began <= at <= end)
                    run.beside_tokens_per_s = run.beside_tokens / (end - began)
            run.wall_s, run.output_tokens = job.wall_s, job.output_tokens
            run.tokens_per_s = job.output_tokens / job.wall_s if job.wall_s else None
            if layout in WITH_AGENTS and not args.whole:
                run.wall_s = run.tokens_per_s = None  # stopped after the agents: no whole figure
            run.failed_items = job.failed
            run.error = job.error or run.error
            run.samples = [asdict(s) for s in job.samples]
        run.crossbar_cpu_s = cpu_seconds(process.pid) - before
        if work is not None:
            admin = admin_port(sitting.work / f"{label}-crossbar.toml")
            run.stopped = await stopped_total(reactor, admin)
    except (DemoError, openai.OpenAIError) as e:
        run.error, run.failed_items = f"{type(e).__name__}: {e}", run.items
    finally:
        halt.set()
        for line in stop(list(reversed(sitting.processes.started))):
            if "killed" in line:
                print(line, file=out)
        sitting.processes.started.clear()
        if work is not None and not work.called:
            await work  # its requests fail at once now that crossbar is gone
    rate = f"{run.tokens_per_s:.1f} tokens/s" if run.tokens_per_s else "-"
    beside = f"{run.beside_tokens_per_s:.1f}" if run.beside_tokens_per_s is not None else "-"
    print(f"{label}: TTFT p99 {run.ttft_p99_s or 0:.2f} s, {rate} ({beside} beside the agents), "
          f"wall {run.wall_s or 0:.1f} s, {run.failed_items} items and {run.failed_turns} turns "
          "failed" + "".join(f" ({x[:160]})" for x in (run.error, run.note) if x), file=out,
          flush=True)  # fmt: skip
    return run


def median(values: list[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None


def report(results: dict[str, list[Run]], args: argparse.Namespace, out: TextIO) -> list[str]:
    """The layouts' medians (ranges) over the runs, then the targets; the targets' lines."""
    order = "in turn" if args.interleave else "in blocks"
    print(f"\n{args.items} items ({len(SYSTEMS)} system prompts {order}, max_tokens "
          f"{args.max_tokens}) and "
          f"{AGENTS} agents x {args.agent_turns} streamed turns (think {THINK} s, "
          f"{AGENT_TOKENS} tokens) on {HOSTS} hosts of 2 slots; the pool {args.pool_threads} "
          "threads", file=out)  # fmt: skip
    alone_p99 = median([r.ttft_p99_s for r in results.get("agents-alone", [])])
    alone_rate = median([r.tokens_per_s for r in results.get("batch-alone", [])])
    print("| layout | TTFT p50 s | TTFT p99 s | p99 / alone | tokens/s | tokens/s beside agents "
          "| / alone | wall s | failed items | failed turns | items stopped | crossbar CPU s "
          "| CPU ms/item |", file=out)  # fmt: skip
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|", file=out)

    def cell(values: list[float | None], digits: int = 1) -> str:
        return spread([v for v in values if v is not None], digits)

    def to_floor(r: Run) -> float | None:
        return r.ttft_p99_s / alone_p99 if r.ttft_p99_s is not None and alone_p99 else None

    def to_alone(r: Run) -> float | None:
        rate = r.tokens_per_s if r.layout == "batch-alone" else r.beside_tokens_per_s
        return rate / alone_rate if rate is not None and alone_rate else None

    for layout, runs in results.items():
        agents = layout in WITH_AGENTS
        cells = [
            cell([r.ttft_p50_s for r in runs], 2) if agents else "-",
            cell([r.ttft_p99_s for r in runs], 2) if agents else "-",
            cell([to_floor(r) for r in runs], 2) if agents and layout != "agents-alone" else "-",
            cell([r.tokens_per_s for r in runs]),
            cell([r.beside_tokens_per_s for r in runs]),
            cell([to_alone(r) for r in runs], 2),
            cell([r.wall_s for r in runs]),
            cell([r.failed_items for r in runs], 0) if layout != "agents-alone" else "-",
            cell([r.failed_turns for r in runs], 0) if agents else "-",
            cell([r.stopped for r in runs], 0),
            cell([r.crossbar_cpu_s for r in runs], 2),
            cell([r.cpu_ms_per_item for r in runs], 2),
        ]
        print(f"| {layout} | " + " | ".join(cells) + " |", file=out)
    lines = targets(results, alone_p99, alone_rate)
    print("\nIssue 49's targets:", file=out)
    for line in lines:
        print(f"- {line}", file=out)
    for layout, runs in results.items():
        for n, r in enumerate(runs, 1):
            for x in (r.error, r.note):
                if x:
                    print(f"{layout} run {n}: {x[:300]}", file=out)
    return lines


def targets(
    results: dict[str, list[Run]], alone_p99: float | None, alone_rate: float | None
) -> list[str]:
    """Whether the batch's layouts met issue 49's targets (medians over the runs)."""
    beside = results.get("batch-agents", [])
    p99 = median([r.ttft_p99_s for r in beside])
    rate = median([r.beside_tokens_per_s for r in beside])
    lines = []
    if p99 is None or not alone_p99:
        lines.append(f"agents' TTFT p99 beside the batch at most {TTFT_TARGET}x alone: not "
                     "measured (needs agents-alone and batch-agents)")  # fmt: skip
    else:
        met = "met" if p99 <= TTFT_TARGET * alone_p99 else "NOT met"
        lines.append(f"agents' TTFT p99 beside the batch at most {TTFT_TARGET}x alone: {met} "
                     f"({p99:.2f} s against {alone_p99:.2f} s, "
                     f"{p99 / alone_p99:.2f}x)")  # fmt: skip
    if rate is None or not alone_rate:
        lines.append(f"the batch's tokens/s beside the agents at least {RATE_TARGET:.0%} of "
                     "alone: not measured (needs batch-alone and batch-agents)")  # fmt: skip
    else:
        met = "met" if rate >= RATE_TARGET * alone_rate else "NOT met"
        lines.append(f"the batch's tokens/s beside the agents at least {RATE_TARGET:.0%} of "
                     f"alone: {met} ({rate:.1f} against {alone_rate:.1f}, "
                     f"{rate / alone_rate:.0%})")  # fmt: skip
    return lines


async def run_sitting(reactor: Any, sitting: Sitting) -> dict[str, list[Run]]:
    layouts = sitting.args.layouts
    results: dict[str, list[Run]] = {name: [] for name in layouts}
    for n in range(sitting.args.runs):
        for layout in layouts if n % 2 == 0 else list(reversed(layouts)):
            results[layout].append(await run_one(reactor, sitting, layout))
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--layouts", default=",".join(LAYOUTS), help="of: %(default)s")
    p.add_argument("--items", type=int, default=ITEMS, help="the batch's (default %(default)s)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--agent-turns", type=int, default=TURNS,
                   help="each agent's turns, at least 2 (default %(default)s)")  # fmt: skip
    p.add_argument("--pool-threads", type=int, default=POOL_THREADS,
                   help="the pool script's threads (default %(default)s)")  # fmt: skip
    p.add_argument("--max-tokens", type=int, default=ITEM_TOKENS,
                   help="each item's max_tokens (default %(default)s)")  # fmt: skip
    whole = "beside the agents, let the batch or pool run to its end (by default it is stopped "
    whole += "once the agents are done: only its rate beside them is wanted)"
    p.add_argument("--whole", action="store_true", help=whole)
    p.add_argument("--interleave", action="store_true",
                   help="items take the 4 system prompts in turn, not in 4 blocks")  # fmt: skip
    p.add_argument("--crossbar-python", default=sys.executable,
                   help="the Python of the venv whose twistd runs crossbar")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = p.parse_args(argv)
    args.layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    if set(args.layouts) - set(LAYOUTS) or not args.layouts:
        p.error(f"--layouts of {list(LAYOUTS)}")
    if args.items < 1 or args.runs < 1 or args.agent_turns < 2 or args.pool_threads < 1:
        p.error("--items, --runs and --pool-threads at least 1, --agent-turns at least 2")
    args.before_python = ""  # start_fleet's: no -before layouts here
    llama_paths(p, args)
    return args


def with_checkout_first(path: Path) -> None:
    """Every process started from here imports crossbar from `path` (PYTHONPATH's first)."""
    rest = [x for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x and x != str(path)]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(path), *rest])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    with_checkout_first(CHECKOUT)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{os.cpu_count()} cores", file=out)  # fmt: skip
    print(f"crossbar from {crossbar_checkout(args.crossbar_python)}", file=out)

    def body(processes: Any, work: Path) -> int:
        print(f"logs of every process in {work}", file=out, flush=True)
        sitting = Sitting(args, processes, work, out, PortPicker(PORTS))
        began = time.monotonic()
        found: dict[str, list[Run]] = {}

        async def go(reactor: Any) -> None:
            found.update(await run_sitting(reactor, sitting))

        status = react(go)
        lines = report(found, args, out)
        if args.json:
            layouts = {k: [asdict(r) | {"cpu_ms_per_item": r.cpu_ms_per_item} for r in v]
                       for k, v in found.items()}  # fmt: skip
            print(json.dumps({"layouts": layouts, "targets": lines}, indent=2))
        print(f"the sitting took {time.monotonic() - began:.0f} s", file=out)
        return status

    return with_processes("real-batches", body, keep=True)


if __name__ == "__main__":
    sys.exit(main())
