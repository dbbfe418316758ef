"""Request classes (issue 48) on real llama-servers: what agents wait while a batch job floods
the fleet beside them, in each way crossbar can be set up for it.

    .venv/bin/python bench/real/real_classes.py [--layouts alone,default,routes,classes]
        [--runs 3] [--crossbar-python .venv/bin/python]
        [--before-python ../before/.venv/bin/python] [--json]

Each run starts 2 llama-servers afresh (`-np 2 -c 8192 -t 1 --cache-ram 24 --no-repack`;
LLAMA_SERVER and LLAMA_MODEL, else `make real`'s build) and crossbar (`twistd -n crossbar`) in
front of them. The workload, the shape issue 48 measured:

- agents: 3 conversations take 5 streamed turns each (the whole conversation so far, `max_tokens`
  32, temperature 0), thinking 0.5 s between turns, all three at once;
- batch: a client keeps 6 requests in flight until 24 are done (distinct prompts, `max_tokens`
  128, not streamed), starting 1 s before the agents.

The layouts:

- `alone`: the agents with no batch at all (the floor);
- `default`: the batch on the agents' route, unmarked (what crossbar did before classes);
- `routes`: today's way without classes: the batch on a route of its own with `priority = -10`
  and `max_in_flight = 2`, the agents' route `priority = 10`;
- `classes`: the batch on the agents' route, marked `service_tier: "flex"` (class batch), at
  the defaults: it queues after every turn, holds what the turns leave of a host
  (`batch_slots` unset), goes where that leaves room, and a batch item running when a turn has
  waited 200 ms behind it is stopped and sent again (`batch_yield_after`);
- `no-yield`: the same with `batch_yield_after = false`;
- `classes-before`, `yielding-before`: crossbar from `--before-python`'s venv (an earlier build,
  to compare: skipped without it), the batch marked as in `classes`, with no key set and with
  `batch_yield_after = "200ms"`.

Printed per layout over `--runs` runs (the layouts' order reversed every other run): the agents'
time to first token p50 and p99 over their later turns (2 to 5), their turn p99, the batch's
wall seconds (its first request sent to its last answer) and output tokens a second, failed
requests, and crossbar's CPU seconds; each the median of the runs with their range. Logs of
every process are kept in a directory printed at the start. Ports come from 23000-23999.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from twisted.internet import defer, task
from twisted.web.client import Agent, HTTPConnectionPool, readBody
from twisted.web.http_headers import Headers

from bench.common.measure import (
    BytesProducer,
    cpu_seconds,
    crossbar_checkout,
    percentile,
    react,
    wait_http,
    with_processes,
)
from bench.real.agent_workload import MODEL, Phase, TurnResult, Workload, run_phases, through
from bench.real.real_models import (
    HOSTS,
    LLAMA_ARGS,
    LLAMA_MODEL,
    LLAMA_SERVER,
    START_SECONDS,
    Sitting,
    spread,
)
from crossbar.demo.plan import DemoError
from crossbar.demo.processes import Process, Processes, stop

LAYOUTS = ("alone", "default", "routes", "classes", "no-yield", "classes-before",
           "yielding-before")  # fmt: skip
BEFORE = "-before"  # a layout run by --before-python's crossbar
AGENTS, TURNS, THINK, AGENT_TOKENS = 3, 5, 0.5, 32
BATCH_ITEMS, BATCH_AT_ONCE, BATCH_TOKENS, BATCH_LEAD = 24, 6, 128, 1.0
ANSWER_SECONDS = 300.0
YIELD_AFTER = "200ms"  # the yielding-before layout's batch_yield_after

CONFIG = """\
[server]
listen = "tcp:{listen}:interface=127.0.0.1"
admin_listen = "tcp:{admin}:interface=127.0.0.1"
db = "{db}"
shutdown_grace = "1s"

{hosts}
[routes.agents]
hosts = [{names}]
default_model = "{model}"
{agents}
[routes.batch]
hosts = [{names}]
default_model = "{model}"
{batch}
"""
ROUTE_KEYS = {
    "routes": ("priority = 10\n", "priority = -10\nmax_in_flight = 2\n"),
    "yielding": (f'batch_yield_after = "{YIELD_AFTER}"\n', ""),  # as yielding-before
    "no-yield": ("batch_yield_after = false\n", ""),
}


@dataclass
class Run:
    """One layout's numbers in one run."""

    layout: str
    ttft_p50_s: float = 0.0
    ttft_p99_s: float = 0.0
    turn_p99_s: float = 0.0
    batch_wall_s: float | None = None
    batch_tokens_per_s: float | None = None
    failed: int = 0
    error: str = ""
    crossbar_cpu_s: float = 0.0
    load_before: float = 0.0
    turns: list[dict[str, Any]] = field(default_factory=list)


async def start_fleet(
    reactor: Any, sitting: Sitting, layout: str, label: str
) -> tuple[str, str, Process]:
    """2 fresh llama-servers and crossbar before them: the agents' and the batch's chat URLs
    and crossbar's process."""
    args, processes = sitting.args, sitting.processes
    urls = {}
    for i, port in enumerate(sitting.ports.take(HOSTS)):
        argv = [args.llama_server, "-m", args.llama_model, "--alias", MODEL, *LLAMA_ARGS,
                "--no-webui", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
        processes.start(f"{label}-h{i}", argv)
        urls[f"h{i}"] = f"http://127.0.0.1:{port}"
    for process, url in zip(processes.started[-HOSTS:], urls.values(), strict=True):
        await wait_http(reactor, process, f"{url}/health", lambda s, _b: s == 200, START_SECONDS,
                        "start")  # fmt: skip
    listen, admin = sitting.ports.take(2)
    layout, before = layout.removesuffix(BEFORE), layout.endswith(BEFORE)
    agents_keys, batch_keys = ROUTE_KEYS.get(layout, ("", ""))
    text = CONFIG.format(
        listen=listen,
        admin=admin,
        db=sitting.work / f"{label}-crossbar.db",
        hosts="".join(
            f'[hosts.{n}]\nurl = "{u}"\nmodels = ["{MODEL}"]\n\n' for n, u in urls.items()
        ),
        names=", ".join(f'"{n}"' for n in urls),
        model=MODEL,
        agents=agents_keys,
        batch=batch_keys,
    )
    config = sitting.work / f"{label}-crossbar.toml"
    config.write_text(text)
    twistd = str(Path(args.before_python if before else args.crossbar_python).parent / "twistd")
    process = processes.start(f"{label}-crossbar", [twistd, "-n", "--pidfile=", "crossbar", "-c",
                                                    str(config)])  # fmt: skip

    def all_healthy(status: int, body: bytes) -> bool:
        hosts = json.loads(body)["hosts"] if status == 200 else []
        return len(hosts) == HOSTS and all(h.get("healthy") for h in hosts)

    await wait_http(reactor, process, f"http://127.0.0.1:{admin}/api/hosts", all_healthy,
                    START_SECONDS, "find every host healthy")  # fmt: skip
    base = f"http://127.0.0.1:{listen}/r"
    route = "batch" if layout == "routes" else "agents"
    return f"{base}/agents/v1/chat/completions", f"{base}/{route}/v1/chat/completions", process


def batch_body(item: int, flex: bool) -> bytes:
    """Batch item `item`: a prompt of its own (nothing shared beyond the instruction)."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "Summarize the record in three sentences."},
            {
                "role": "user",
                "content": f"Record {item}: order #{1000 + item} shipped late; "
                f"the customer in zone {item % 7} asks for a refund of {item * 3} euros.",
            },
        ],
        "max_tokens": BATCH_TOKENS,
        "temperature": 0,
    }
    if flex:
        body["service_tier"] = "flex"
    return json.dumps(body).encode()


async def run_batch(reactor: Any, url: str, flex: bool) -> tuple[float, int, int, str]:
    """The batch: (wall seconds, output tokens, failed items, first error)."""
    pool = HTTPConnectionPool(reactor)
    pool.maxPersistentPerHost = BATCH_AT_ONCE
    agent = Agent(reactor, pool=pool)
    gate = defer.DeferredSemaphore(BATCH_AT_ONCE)
    tokens, failed, errors = [0], [0], [""]

    async def item(i: int) -> None:
        headers = Headers({b"Content-Type": [b"application/json"]})
        try:
            response = await agent.request(
                b"POST", url.encode(), headers, BytesProducer(batch_body(i, flex))
            ).addTimeout(ANSWER_SECONDS, reactor)
            data = await readBody(response)
            if response.code != 200:
                raise ValueError(f"HTTP {response.code}: {data[:120]!r}")
            tokens[0] += int(json.loads(data)["usage"]["completion_tokens"])
        except Exception as e:
            failed[0] += 1
            errors[0] = errors[0] or f"{type(e).__name__}: {e}"

    began = reactor.seconds()
    try:
        await defer.gatherResults(
            [defer.ensureDeferred(gate.run(item, i)) for i in range(BATCH_ITEMS)],
            consumeErrors=True,
        )
    finally:
        await pool.closeCachedConnections()
    return reactor.seconds() - began, tokens[0], failed[0], errors[0]


async def run_agents(reactor: Any, url: str, turns: int = TURNS) -> list[TurnResult]:
    """The agents: `AGENTS` conversations at once, each `turns` streamed turns (`AGENT_TOKENS`
    tokens) thinking `THINK` s between two, every turn sent to `url`."""
    workload = Workload(AGENTS, turns, AGENTS, max_tokens=AGENT_TOKENS, stream=True)
    thinks = ((0.0,) + (THINK,) * (turns - 1),) * AGENTS
    phases = [Phase("agents", tuple(range(AGENTS)), thinks, AGENTS)]
    return await run_phases(reactor, through(url), workload, phases, lambda _h, _u: "")


def agent_times(results: list[TurnResult]) -> tuple[float, float, float]:
    """The agents' TTFT p50 and p99 and turn p99 over their later turns (2 on) answered whole."""
    later = [r for r in results if r.turn > 1 and r.status == 200 and not r.error]
    ttft = [r.ttft_s for r in later if r.ttft_s is not None]
    return percentile(ttft, 50), percentile(ttft, 99), percentile([r.seconds for r in later], 99)


async def run_one(reactor: Any, sitting: Sitting, layout: str) -> Run:
    """One layout's run, from fresh hosts; its processes stopped after."""
    out = sitting.progress
    sitting.runs += 1
    label = f"{sitting.runs:02d}-{layout}"
    run = Run(layout, load_before=os.getloadavg()[0])
    print(f"{label}: starting (load {run.load_before:.2f})", file=out, flush=True)
    try:
        agents_url, batch_url, process = await start_fleet(reactor, sitting, layout, label)
        before = cpu_seconds(process.pid)
        batch = None
        if layout != "alone":
            flex = layout.removesuffix(BEFORE) in ("classes", "no-yield", "yielding")
            batch = defer.ensureDeferred(run_batch(reactor, batch_url, flex))
            await task.deferLater(reactor, BATCH_LEAD, lambda: None)
        results = await run_agents(reactor, agents_url)
        run.ttft_p50_s, run.ttft_p99_s, run.turn_p99_s = agent_times(results)
        run.failed = sum(1 for r in results if r.error)
        run.error = next((r.error for r in results if r.error), "")
        run.turns = [asdict(r) for r in results]
        if batch is not None:
            wall, tokens, failed, error = await batch
            run.batch_wall_s, run.batch_tokens_per_s = wall, tokens / wall if wall else 0.0
            run.failed += failed
            run.error = run.error or error
        run.crossbar_cpu_s = cpu_seconds(process.pid) - before
    except DemoError as e:
        run.error, run.failed = str(e), 1
    finally:
        for line in stop(list(reversed(sitting.processes.started))):
            if "killed" in line:
                print(line, file=out)
        sitting.processes.started.clear()
    print(f"{label}: TTFT p99 {run.ttft_p99_s:.2f} s, batch wall {run.batch_wall_s or 0:.1f} s, "
          f"{run.failed} failed" + (f" ({run.error[:120]})" if run.error else ""), file=out,
          flush=True)  # fmt: skip
    return run


def report(results: dict[str, list[Run]], out: TextIO) -> None:
    """The layouts' medians (ranges) over the runs."""
    shape = f"{AGENTS} agents x {TURNS} streamed turns (think {THINK} s)"
    print(f"\n{shape} beside {BATCH_ITEMS} batch items, {BATCH_AT_ONCE} at once, on {HOSTS} "
          "hosts of 2 slots", file=out)  # fmt: skip
    print("| layout | TTFT p50 s | TTFT p99 s | turn p99 s | batch wall s | batch tokens/s | "
          "failed | crossbar CPU s |", file=out)  # fmt: skip
    print("|---|--:|--:|--:|--:|--:|--:|--:|", file=out)
    for layout, runs in results.items():
        walls = [r.batch_wall_s for r in runs if r.batch_wall_s is not None]
        rates = [r.batch_tokens_per_s for r in runs if r.batch_tokens_per_s is not None]
        cells = [
            spread([r.ttft_p50_s for r in runs], 2),
            spread([r.ttft_p99_s for r in runs], 2),
            spread([r.turn_p99_s for r in runs], 2),
            spread(walls) if walls else "-",
            spread(rates) if rates else "-",
            spread([r.failed for r in runs], 0),
            spread([r.crossbar_cpu_s for r in runs]),
        ]
        print(f"| {layout} | " + " | ".join(cells) + " |", file=out)


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
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--crossbar-python", default=sys.executable,
                   help="the Python of the venv whose twistd runs crossbar")  # fmt: skip
    p.add_argument("--before-python", default="",
                   help="an earlier build's venv Python, for -before layouts")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = p.parse_args(argv)
    args.layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    if not args.before_python:  # said in the docstring: skipped without it
        args.layouts = [x for x in args.layouts if not x.endswith(BEFORE)]
    if set(args.layouts) - set(LAYOUTS) or args.runs < 1:
        p.error(f"--layouts of {list(LAYOUTS)}; --runs at least 1")
    llama_paths(p, args)
    return args


def llama_paths(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`args.llama_server` and `args.llama_model` from LLAMA_SERVER and LLAMA_MODEL, else
    `make real`'s build; `p.error` when either file is missing."""
    args.llama_server = os.environ.get("LLAMA_SERVER") or str(LLAMA_SERVER)
    args.llama_model = os.environ.get("LLAMA_MODEL") or str(LLAMA_MODEL)
    for what, path in (("LLAMA_SERVER", args.llama_server), ("LLAMA_MODEL", args.llama_model)):
        if not Path(path).is_file():
            p.error(f"{what}: no {path} (run `make real`, or set {what})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{os.cpu_count()} cores", file=out)  # fmt: skip
    print(f"crossbar from {crossbar_checkout(args.crossbar_python)}", file=out)
    if args.before_python:
        print(f"before from {crossbar_checkout(args.before_python)}", file=out)

    def body(processes: Processes, work: Path) -> int:
        print(f"logs of every process in {work}", file=out, flush=True)
        sitting = Sitting(args, processes, work, out)
        began = time.monotonic()
        found: dict[str, list[Run]] = {}

        async def go(reactor: Any) -> None:
            found.update(await run_sitting(reactor, sitting))

        status = react(go)
        if args.json:
            print(json.dumps({k: [asdict(r) for r in v] for k, v in found.items()}, indent=2))
        else:
            report(found, out)
        print(f"the sitting took {time.monotonic() - began:.0f} s", file=out)
        return status

    return with_processes("real-classes", body, keep=True)


if __name__ == "__main__":
    sys.exit(main())
