"""What each router costs a fleet of router-mode llama-servers in model loads, and what its
agents wait: real llama-servers in router mode (`--models-dir`, `--models-max N`), the `make
real` model under several names, several models' conversations through crossbar, crossbar
without model awareness (an older build), vllm-router (round_robin and cache_aware), and the
floor (each model sent to a host of its own by the client).

    .venv/bin/python bench/real/real_models.py [--scenarios two,three,skewed]
        [--routers floor,crossbar,before,round-robin,cache-aware] [--runs 3]
        [--before-python ../before/.venv/bin/python] [--json]

Each scenario, for each router in turn, starts 2 router-mode llama-servers afresh (`-np 2 -c 8192
-t 1 --cache-ram 24 --no-repack`, passed to every model's child; LLAMA_SERVER and LLAMA_MODEL,
else `make real`'s build), so every router meets unloaded models and cold caches. The workload:
the scenario's conversations begun one at a time in their order (the models interleaved), then
each takes 3 more turns, 3 conversations at a time; every turn is the whole conversation so far,
streamed (`max_tokens` 24, temperature 0). The scenarios:

- `two`: `coder` and `chat`, 4 conversations each, `--models-max 1` (the issue's measured shape);
- `three`: `coder`, `chat` and `vision`, 4 each, `--models-max 2`;
- `skewed`: `coder` hot (6 conversations), `chat` and `vision` cold (1 each), `--models-max 1`.

The routers: `floor` (no proxy: the client sends each model to one host, the busiest model alone
where it can be); `crossbar` (this checkout's twistd, both hosts `models = "discover"`); `before`
(the same from `--before-python`'s venv: a build without model awareness; skipped without it);
`round-robin` and `cache-aware` (vllm-router `--policy round_robin` / `cache_aware`, installed into
~/.cache/crossbar-peers on first use).

Prints per scenario and router, over `--runs` sittings (the routers' order reversed every other
run): model loads (the routers' `spawning server instance` lines, h0 + h1), wall seconds, the
first token's and the whole turn's p50 and p99, prefill tokens (`timings.prompt_n`), failed turns
(a router's swap error relayed is one), and the CPU seconds of the router. Each value is the
median of the runs with their range. Logs of every process are kept in a directory printed at
the start. Ports come from 23000-23999.
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

from bench.common.measure import (
    PortPicker,
    cpu_seconds,
    crossbar_checkout,
    percentile,
    react,
    wait_http,
    with_processes,
)
from bench.peers import peer_routers
from bench.real.agent_workload import (
    HostOf,
    Phase,
    Target,
    TurnResult,
    Workload,
    header_host,
    run_phases,
    sent_to,
    through,
)
from crossbar.demo.plan import DemoError
from crossbar.demo.processes import Process, Processes, stop

ROUTERS = ("floor", "crossbar", "before", "round-robin", "cache-aware")
PEER_POLICY = {"round-robin": "round_robin", "cache-aware": "cache_aware"}
HOSTS = 2
PORTS = range(23000, 24000)
CACHE = Path.home() / ".cache" / "crossbar-real"
LLAMA_SERVER = CACHE / "llama.cpp" / "build" / "bin" / "llama-server"
LLAMA_MODEL = CACHE / "gemma-3-270m-q4_k_m.gguf"
LLAMA_ARGS = ("-np", "2", "-c", "8192", "-t", "1", "--cache-ram", "24", "--no-repack")
START_SECONDS = 120.0
LOAD_LINE = "spawning server instance with name="  # one per model load, in the router's log
LATER_TURNS, AT_ONCE = 3, 3


@dataclass(frozen=True)
class Scenario:
    """Which models the fleet serves, each conversation's model in order, and how many
    models each host holds at once."""

    models: tuple[str, ...]
    conversations: tuple[str, ...]
    models_max: int


SCENARIOS = {
    "two": Scenario(("coder", "chat"), ("coder", "chat") * 4, 1),
    "three": Scenario(("coder", "chat", "vision"), ("coder", "chat", "vision") * 4, 2),
    "skewed": Scenario(
        ("coder", "chat", "vision"),
        ("coder", "chat", "coder", "vision", "coder") + ("coder",) * 3,
        1,
    ),
}

CROSSBAR_CONFIG = """\
[server]
listen = "tcp:{listen}:interface=127.0.0.1"
admin_listen = "tcp:{admin}:interface=127.0.0.1"
db = "{db}"
shutdown_grace = "1s"

{hosts}
[routes.bench]
hosts = [{names}]
"""


@dataclass
class Run:
    """One router's numbers in one scenario's sitting."""

    router: str
    loads: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    ttft_p50_s: float = 0.0
    ttft_p99_s: float = 0.0
    turn_p50_s: float = 0.0
    turn_p99_s: float = 0.0
    prefill: int = 0
    turns: int = 0
    failed: int = 0
    error: str = ""
    router_cpu_s: float | None = None

    @property
    def total_loads(self) -> int:
        return sum(self.loads.values())


def floor_of(scenario: Scenario) -> dict[str, int]:
    """The floor's host for each model: the busiest model first, each to the host with the
    fewest conversations so far, at most `models_max` models a host."""
    demand = {m: scenario.conversations.count(m) for m in scenario.models}
    load, count = [0] * HOSTS, [0] * HOSTS
    host_of: dict[str, int] = {}
    for model in sorted(scenario.models, key=lambda m: -demand[m]):
        free = [h for h in range(HOSTS) if count[h] < scenario.models_max] or list(range(HOSTS))
        host = min(free, key=lambda h: load[h])
        host_of[model] = host
        load[host] += demand[model]
        count[host] += 1
    return host_of


def phases(scenario: Scenario) -> list[Phase]:
    """Conversations begun one at a time, then each `LATER_TURNS` more, `AT_ONCE` at a time."""
    order = tuple(range(len(scenario.conversations)))
    return [
        Phase("begin", order, ((0.0,),) * len(order), 1),
        Phase("turns", order, ((0.0,) * LATER_TURNS,) * len(order), AT_ONCE),
    ]


@dataclass
class Sitting:
    """What every run shares: the command line, processes, logs and ports."""

    args: argparse.Namespace
    processes: Processes
    work: Path
    progress: TextIO
    ports: PortPicker = field(default_factory=lambda: PortPicker(PORTS))
    runs: int = 0


def models_dir(where: Path, scenario: Scenario, gguf: str) -> Path:
    """The routers' models directory: the one GGUF file under each of the scenario's names."""
    where.mkdir()
    for name in scenario.models:
        (where / f"{name}.gguf").symlink_to(Path(gguf).resolve())
    return where


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


async def start_hosts(
    reactor: Any, sitting: Sitting, scenario: Scenario, label: str
) -> dict[str, str]:
    """2 fresh router-mode llama-servers serving the scenario's models; name -> base URL."""
    args = sitting.args
    models = models_dir(sitting.work / f"{label}-models", scenario, args.llama_model)
    urls = {}
    for i, port in enumerate(sitting.ports.take(HOSTS)):
        argv = [args.llama_server, "--models-dir", str(models), "--models-max",
                str(scenario.models_max), *LLAMA_ARGS, "--no-webui", "--host", "127.0.0.1",
                "--port", str(port)]  # fmt: skip
        sitting.processes.start(f"{label}-h{i}", argv)
        urls[f"h{i}"] = f"http://127.0.0.1:{port}"
    for process, url in zip(sitting.processes.started[-HOSTS:], urls.values(), strict=True):
        await wait_http(reactor, process, f"{url}/health", lambda s, _b: s == 200, START_SECONDS,
                        "start")  # fmt: skip
    return urls


async def start_crossbar(
    reactor: Any, sitting: Sitting, urls: dict[str, str], python: str, label: str
) -> tuple[Process, str]:
    """crossbar under twistd from `python`'s venv over `urls` (each `models = "discover"`), once
    it finds every host healthy; the process and the route's chat completions URL."""
    listen, admin = sitting.ports.take(2)
    hosts = "".join(f'[hosts.{n}]\nurl = "{u}"\nmodels = "discover"\n\n' for n, u in urls.items())
    text = CROSSBAR_CONFIG.format(
        listen=listen,
        admin=admin,
        db=sitting.work / f"{label}-crossbar.db",
        hosts=hosts,
        names=", ".join(f'"{n}"' for n in urls),
    )
    config = write_config(sitting.work / f"{label}-crossbar.toml", text)
    twistd = str(Path(python).parent / "twistd")
    process = sitting.processes.start(f"{label}-crossbar", [twistd, "-n", "--pidfile=", "crossbar",
                                                           "-c", str(config)])  # fmt: skip

    def all_healthy(status: int, body: bytes) -> bool:
        hosts = json.loads(body)["hosts"] if status == 200 else []
        return len(hosts) == len(urls) and all(h.get("healthy") for h in hosts)

    await wait_http(reactor, process, f"http://127.0.0.1:{admin}/api/hosts", all_healthy,
                    START_SECONDS, "find every host healthy")  # fmt: skip
    return process, f"http://127.0.0.1:{listen}/r/bench/v1/chat/completions"


async def start_router(
    reactor: Any, sitting: Sitting, scenario: Scenario, router: str, label: str
) -> tuple[Target, HostOf, Process | None, list[Process]]:
    """Fresh hosts and `router` in front of them, ready for work."""
    urls = await start_hosts(reactor, sitting, scenario, label)
    hosts = sitting.processes.started[-HOSTS:]
    chat = {name: f"{url}/v1/chat/completions" for name, url in urls.items()}
    names = {url: name for name, url in urls.items()}
    if router == "floor":
        where = floor_of(scenario)
        ordered = list(chat.values())

        def target(conversation: int, _turn: int) -> str:
            return ordered[where[scenario.conversations[conversation]]]

        return target, sent_to({c: n for n, c in chat.items()}), None, hosts
    if router in ("crossbar", "before"):
        python = (
            sitting.args.crossbar_python if router == "crossbar" else sitting.args.before_python
        )
        process, url = await start_crossbar(reactor, sitting, urls, python, label)
        return through(url), header_host(b"X-Crossbar-Host", names), process, hosts
    port, prometheus = sitting.ports.take(2)
    workers, policy = list(urls.values()), PEER_POLICY[router]
    process = peer_routers.launch(
        sitting.processes, "vllm-router", port, workers, policy, prometheus, label=f"{label}-router"
    )
    base = f"http://127.0.0.1:{port}"
    await peer_routers.wait_ready(reactor, process, base, HOSTS)
    return through(f"{base}/v1/chat/completions"), sent_to({}), process, hosts


def loads_of(hosts: list[Process]) -> dict[str, int]:
    """Model loads each host's log shows."""
    return {
        f"h{i}": p.log.read_text(errors="replace").count(LOAD_LINE) for i, p in enumerate(hosts)
    }


def row(router: str, results: list[TurnResult]) -> Run:
    good = [r for r in results if r.status == 200 and not r.error]
    ttft = [r.ttft_s for r in good if r.ttft_s is not None]
    seconds = [r.seconds for r in good]
    failed = [r for r in results if r.error]
    return Run(
        router,
        ttft_p50_s=percentile(ttft, 50),
        ttft_p99_s=percentile(ttft, 99),
        turn_p50_s=percentile(seconds, 50),
        turn_p99_s=percentile(seconds, 99),
        prefill=sum(r.prompt_n for r in good),
        turns=len(good),
        failed=len(failed),
        error=failed[0].error if failed else "",
    )


async def run_one(reactor: Any, sitting: Sitting, name: str, router: str) -> Run:
    """One router's run of scenario `name`, from fresh hosts; its processes stopped after."""
    scenario, out = SCENARIOS[name], sitting.progress
    sitting.runs += 1
    label = f"{sitting.runs:02d}-{name}-{router}"
    workload = Workload(len(scenario.conversations), 1 + LATER_TURNS, AT_ONCE, stream=True,
                        models=scenario.conversations)  # fmt: skip
    print(f"{label}: starting", file=out, flush=True)
    hosts: list[Process] = []
    process = None
    try:
        target, host_of, process, hosts = await start_router(reactor, sitting, scenario, router,
                                                             label)  # fmt: skip
        before = cpu_seconds(process.pid) if process is not None else 0.0
        began = reactor.seconds()
        results = await run_phases(reactor, target, workload, phases(scenario), host_of)
        wall = reactor.seconds() - began
        run = row(router, results)
        run.wall_s = wall
        if process is not None:
            run.router_cpu_s = cpu_seconds(process.pid) - before
        run.loads = loads_of(hosts)
    except (DemoError, peer_routers.PeerUnavailable) as e:
        run = Run(router, error=str(e), failed=1)
    finally:
        for line in stop(list(reversed(sitting.processes.started))):
            if "killed" in line:
                print(line, file=out)
        sitting.processes.started.clear()
    print(f"{label}: {run.total_loads} loads, {run.wall_s:.1f} s, {run.failed} failed"
          + (f" ({run.error[:120]})" if run.error else ""), file=out, flush=True)  # fmt: skip
    return run


def spread(values: list[float], digits: int = 1) -> str:
    """The median of `values` with their range: `4 (3-5)`."""
    if not values:
        return "-"
    med = statistics.median(values)
    fmt = f"{{:.{digits}f}}"
    if min(values) == max(values):
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def report(results: dict[str, dict[str, list[Run]]], out: TextIO) -> None:
    """A table per scenario: each router's medians (ranges) over the runs."""
    for name, by_router in results.items():
        s = SCENARIOS[name]
        print(f"\n{name}: {', '.join(s.models)} over {HOSTS} hosts holding {s.models_max} each, "
              f"{len(s.conversations)} conversations", file=out)  # fmt: skip
        print("| router | model loads | wall s | TTFT p50 s | TTFT p99 s | turn p50 s | "
              "turn p99 s | prefill tokens | failed turns | router CPU s |", file=out)  # fmt: skip
        print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|", file=out)
        for router, runs in by_router.items():
            ok = [r for r in runs if not r.error or r.turns]
            cpu = [r.router_cpu_s for r in ok if r.router_cpu_s is not None]
            cells = [
                spread([r.total_loads for r in ok], 0),
                spread([r.wall_s for r in ok]),
                spread([r.ttft_p50_s for r in ok], 2),
                spread([r.ttft_p99_s for r in ok], 2),
                spread([r.turn_p50_s for r in ok], 2),
                spread([r.turn_p99_s for r in ok], 2),
                spread([r.prefill for r in ok], 0),
                spread([r.failed for r in runs], 0),
                spread(cpu) if cpu else "-",
            ]
            print(f"| {router} | " + " | ".join(cells) + " |", file=out)


async def run_sitting(reactor: Any, sitting: Sitting) -> dict[str, dict[str, list[Run]]]:
    args = sitting.args
    results: dict[str, dict[str, list[Run]]] = {}
    for name in args.scenarios:
        results[name] = {r: [] for r in args.routers}
        for n in range(args.runs):
            order = args.routers if n % 2 == 0 else list(reversed(args.routers))
            for router in order:
                results[name][router].append(await run_one(reactor, sitting, name, router))
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="of: %(default)s")
    p.add_argument("--routers", default="floor,crossbar,before,round-robin,cache-aware",
                   help="comma-separated, of: " + ",".join(ROUTERS))  # fmt: skip
    p.add_argument("--runs", type=int, default=3, help="sittings of each router per scenario")
    p.add_argument("--crossbar-python", default=sys.executable,
                   help="the Python of the venv whose twistd runs crossbar")  # fmt: skip
    p.add_argument("--before-python", default="",
                   help="the Python of a venv of crossbar without model awareness")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON instead of the tables")
    args = p.parse_args(argv)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    args.routers = [r.strip() for r in args.routers.split(",") if r.strip()]
    if set(args.scenarios) - set(SCENARIOS) or set(args.routers) - set(ROUTERS):
        p.error(f"--scenarios of {list(SCENARIOS)}, --routers of {list(ROUTERS)}")
    if "before" in args.routers and not args.before_python:
        args.routers.remove("before")  # said in the docstring: skipped without it
    args.llama_server = os.environ.get("LLAMA_SERVER") or str(LLAMA_SERVER)
    args.llama_model = os.environ.get("LLAMA_MODEL") or str(LLAMA_MODEL)
    for what, path in (("LLAMA_SERVER", args.llama_server), ("LLAMA_MODEL", args.llama_model)):
        if not Path(path).is_file():
            p.error(f"{what}: no {path} (run `make real`, or set {what})")
    if args.runs < 1:
        p.error("--runs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    peers = [r for r in args.routers if r in PEER_POLICY]
    if peers and peer_routers.install_all(["vllm-router"], out):
        args.routers = [r for r in args.routers if r not in PEER_POLICY]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{os.cpu_count()} cores", file=out)  # fmt: skip
    print(f"crossbar from {crossbar_checkout(args.crossbar_python)}", file=out)
    if args.before_python:
        print(f"before from {crossbar_checkout(args.before_python)}", file=out)

    def body(processes: Processes, work: Path) -> int:
        print(f"logs of every process in {work}", file=out, flush=True)
        sitting = Sitting(args, processes, work, out)
        began = time.monotonic()
        found: dict[str, Any] = {}

        async def go(reactor: Any) -> None:
            found.update(await run_sitting(reactor, sitting))

        status = react(go)
        if args.json:
            print(json.dumps({name: {r: [asdict(x) for x in runs] for r, runs in by.items()}
                              for name, by in found.items()}, indent=2))  # fmt: skip
        else:
            report(found, out)
        print(f"the sitting took {time.monotonic() - began:.0f} s", file=out)
        return status

    return with_processes("real-models", body, keep=True)


if __name__ == "__main__":
    sys.exit(main())
