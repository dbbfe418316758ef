"""How much prompt each router makes real llama-servers prefill: agent conversations over N
hosts, through crossbar, the peer routers, and two clients that need no router.

    .venv/bin/python bench/real/real_cache.py [--routers ideal,round-robin,crossbar,smg,vllm-router]
        [--hosts 3] [--conversations 9] [--turns 5] [--at-once 3] [--order given|reverse]
        [--crossbar-python .venv/bin/python] [--json]

For each router in turn it starts `--hosts` llama-servers afresh (LLAMA_SERVER and LLAMA_MODEL,
else `make real`'s build in ~/.cache/crossbar-real; `-np 2 -c 8192 -t 1 --cache-ram 24`), so
every router meets cold caches, puts the router in front of them and runs the agent workload:
`--conversations` conversations of `--turns` turns, `--at-once` running at a time, each turn
the whole conversation so far (a shared ~330-token system prompt, a first user message of its
own, then each reply and a new user message) as one non-streamed OpenAI `/v1/chat/completions`
request, `max_tokens` 24 at temperature 0. The routers:

- `ideal`: conversation i straight to host i mod N (no proxy);
- `round-robin`: each request straight to the next host in turn (the client rotates);
- `crossbar`: `twistd -n crossbar -c <config>` from `--crossbar-python`'s venv, one route over
  the hosts, no session header (crossbar fingerprints the conversation), a temporary db;
- `smg` and `vllm-router`: `--policy cache_aware` (bench/peers/peer_routers.py installs them into
  ~/.cache/crossbar-peers on first use; one that cannot be installed is skipped, said why).

Prints per router: prefill tokens (the sum of llama-server's `timings.prompt_n` over all turns,
or `usage.prompt_tokens` minus `cached_tokens` where a router strips `timings`, said so), their
ratio to `ideal`, the cached share of turns 2..T (cache_n / (cache_n + prompt_n)), p50/p95 wall
seconds per turn, the run's wall seconds, the CPU seconds of the router and of the llama-servers
during the run; then the host each conversation's first turn went to (crossbar says it in
`X-Crossbar-Host`, smg in `x-smg-routed-worker-id`, vllm-router nothing: "-") and the turns each
host served (counted in its log). A router whose run fails has the error in its row; the others
still run. Every process's log is kept in a directory printed at the start. All ports are taken
from 21000-21999. One default sitting takes about 3 minutes on 2 quiet cores.
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

from bench.common.measure import (
    PortPicker,
    cpu_seconds,
    crossbar_checkout,
    react,
    wait_http,
    with_processes,
)
from bench.peers import peer_routers
from bench.real.agent_workload import (
    MODEL,
    HostOf,
    Row,
    Target,
    Workload,
    header_host,
    ideal,
    report,
    round_robin,
    run_workload,
    sent_to,
    summarize,
    through,
    with_ratios,
)
from crossbar.demo.plan import DemoError
from crossbar.demo.processes import Process, Processes, stop

ROUTE = "bench"
ROUTERS = ("ideal", "round-robin", "crossbar", "smg", "vllm-router")
PEERS = ("smg", "vllm-router")
PORTS = range(21000, 22000)  # this bench's share of the machine's ports
CACHE = Path.home() / ".cache" / "crossbar-real"
LLAMA_SERVER = CACHE / "llama.cpp" / "build" / "bin" / "llama-server"
LLAMA_MODEL = CACHE / "gemma-3-270m-q4_k_m.gguf"
# As the December 2026 comparison ran them: `--cache-ram 24` (MiB) keeps only a few of this
# tiny model's conversations per host, as a GPU box keeps only a few long ones of a big model;
# with the default 8 GiB even round-robin matches the ideal, every host keeping everything.
LLAMA_ARGS = ("-np", "2", "-c", "8192", "-t", "1", "--cache-ram", "24", "--no-repack")
START_SECONDS = 120.0  # a llama-server loads this model in a few seconds, slower when busy


CROSSBAR_CONFIG = """\
[server]
listen = "tcp:{listen}:interface=127.0.0.1"
admin_listen = "tcp:{admin}:interface=127.0.0.1"
db = "{db}"
default_route = "{route}"
shutdown_grace = "1s"

{hosts}
[routes.{route}]
hosts = [{names}]
default_model = "{model}"
{route_keys}"""


@dataclass
class Sitting:
    """What every router's run shares: the command line, the processes, the log directory."""

    args: argparse.Namespace
    processes: Processes
    work: Path
    progress: TextIO
    skipped: dict[str, str]  # peer routers that could not be installed, and why
    load_before: tuple[float, float, float]
    ports: PortPicker = field(default_factory=lambda: PortPicker(PORTS))
    runs: int = 0


@dataclass
class Started:
    """A router in front of fresh hosts, ready for work."""

    target: Target
    host_of: HostOf
    router: Process | None  # None: the client picks the host itself
    hosts: list[Process]
    admin: str = ""  # crossbar's admin base URL


async def start_hosts(
    reactor: Any, sitting: Sitting, router: str, llama_args: tuple[str, ...] = LLAMA_ARGS
) -> dict[str, str]:
    """`--hosts` fresh llama-servers with `llama_args`, each answering GET /health 200;
    name -> base URL."""
    args = sitting.args
    urls = {}
    for i, port in enumerate(sitting.ports.take(args.hosts)):
        argv = [args.llama_server, "-m", args.llama_model, *llama_args]
        argv += ["--no-webui", "--alias", MODEL, "--host", "127.0.0.1", "--port", str(port)]
        sitting.processes.start(f"{sitting.runs:02d}-{router}-h{i}", argv)
        urls[f"h{i}"] = f"http://127.0.0.1:{port}"
    hosts = sitting.processes.started[-args.hosts :]
    for process, url in zip(hosts, urls.values(), strict=True):
        await wait_http(
            reactor, process, f"{url}/health", lambda s, _b: s == 200, START_SECONDS, "load"
        )
    return urls


async def start_router(reactor: Any, sitting: Sitting, router: str) -> Started:
    """Fresh hosts and `router` in front of them, both ready."""
    urls = await start_hosts(reactor, sitting, router)
    hosts = sitting.processes.started[-len(urls) :]
    chat = {name: f"{url}/v1/chat/completions" for name, url in urls.items()}
    names = {url: name for name, url in urls.items()}
    straight = sent_to({c: name for name, c in chat.items()})
    if router == "ideal":
        return Started(ideal(list(chat.values())), straight, None, hosts)
    if router == "round-robin":
        return Started(round_robin(list(chat.values())), straight, None, hosts)
    if router == "crossbar":
        process, url, admin = await start_crossbar(reactor, sitting, urls)
        host_of = header_host(b"X-Crossbar-Host", names)
        return Started(through(url), host_of, process, hosts, admin)
    return await start_peer(reactor, sitting, router, urls, hosts)


async def start_peer(
    reactor: Any, sitting: Sitting, router: str, urls: dict[str, str], hosts: list[Process]
) -> Started:
    """Peer router `router` (`--policy cache_aware`) in front of the running hosts `urls`
    (name -> base URL; `hosts` their processes), once it has accepted every one."""
    names = {url: name for name, url in urls.items()}
    port, prometheus = sitting.ports.take(2)
    label = f"{sitting.runs:02d}-{router}"
    process = peer_routers.launch(
        sitting.processes, router, port, list(urls.values()), "cache_aware", prometheus, label=label
    )
    base = f"http://127.0.0.1:{port}"
    await peer_routers.wait_ready(reactor, process, base, len(urls))
    # smg names the worker it chose; vllm-router says nothing
    host_of = header_host(b"x-smg-routed-worker-id", names)
    return Started(through(f"{base}/v1/chat/completions"), host_of, process, hosts)


async def start_crossbar(
    reactor: Any, sitting: Sitting, urls: dict[str, str], route_keys: str = ""
) -> tuple[Process, str, str]:
    """crossbar under twistd (from `--crossbar-python`'s venv) over `urls`, once it finds
    every host healthy, its route given `route_keys` (TOML lines) besides its hosts and
    model; the process, the route's chat completions URL and the admin base URL."""
    listen, admin = sitting.ports.take(2)
    hosts = "".join(
        f'[hosts.{name}]\nurl = "{url}"\nmodels = ["{MODEL}"]\n\n' for name, url in urls.items()
    )
    config = sitting.work / f"{sitting.runs:02d}-crossbar.toml"
    config.write_text(
        CROSSBAR_CONFIG.format(
            listen=listen,
            admin=admin,
            db=sitting.work / f"{sitting.runs:02d}-crossbar.db",
            route=ROUTE,
            hosts=hosts,
            names=", ".join(f'"{name}"' for name in urls),
            model=MODEL,
            route_keys=route_keys,
        )
    )
    twistd = str(Path(sitting.args.crossbar_python).parent / "twistd")
    argv = [twistd, "-n", "--pidfile=", "crossbar", "-c", str(config)]
    process = sitting.processes.start(f"{sitting.runs:02d}-crossbar", argv)

    def all_healthy(status: int, body: bytes) -> bool:
        hosts = json.loads(body)["hosts"] if status == 200 else []
        return len(hosts) == len(urls) and all(h.get("healthy") for h in hosts)

    admin_url = f"http://127.0.0.1:{admin}/api/hosts"
    await wait_http(
        reactor, process, admin_url, all_healthy, START_SECONDS, "find every host healthy"
    )
    chat = f"http://127.0.0.1:{listen}/r/{ROUTE}/v1/chat/completions"
    return process, chat, f"http://127.0.0.1:{admin}"


async def run_router(reactor: Any, sitting: Sitting, router: str) -> Row:
    """One router's run, from fresh hosts to its row; its processes stopped after."""
    args, out = sitting.args, sitting.progress
    sitting.runs += 1
    workload = Workload(args.conversations, args.turns, args.at_once)
    print(f"{router}: starting {args.hosts} llama-servers", file=out, flush=True)
    try:
        started = await start_router(reactor, sitting, router)
        before = cpu_of(started)
        began = reactor.seconds()
        print(f"{router}: running {workload.conversations} conversations", file=out, flush=True)
        results = await run_workload(reactor, started.target, workload, started.host_of, out)
        wall = reactor.seconds() - began
        after = cpu_of(started)
        served = {f"h{i}": served_turns(p) for i, p in enumerate(started.hosts)}
    except (DemoError, peer_routers.PeerUnavailable) as e:
        return Row(router, workload.conversations * workload.turns, errors=1, error=str(e))
    finally:
        for line in stop(list(reversed(sitting.processes.started))):
            if "killed" in line:
                print(line, file=out)
        sitting.processes.started.clear()
    row = summarize(router, results, workload)
    row.wall_s = wall
    if all(n is not None for n in served.values()):
        row.host_turns = {name: n for name, n in served.items() if n is not None}
    if started.router is not None:
        row.router_cpu_s = after["router"] - before["router"]
    row.hosts_cpu_s = after["hosts"] - before["hosts"]
    print(f"{router}: {row.answered} turns in {wall:.0f} s, prefill {row.prefill:,}", file=out)
    return row


def served_turns(host: Process) -> int | None:
    """How many completions a llama-server logged (one `prompt eval time` line each); None if
    its log cannot be read."""
    try:
        text = host.log.read_text(errors="replace")
    except OSError:
        return None
    return text.count("prompt eval time")


def cpu_of(started: Started) -> dict[str, float]:
    """CPU seconds so far of the router process and of all hosts together."""
    hosts = sum(cpu_seconds(p.pid) for p in started.hosts)
    router = cpu_seconds(started.router.pid) if started.router is not None else 0.0
    return {"router": router, "hosts": hosts}


async def run_sitting(reactor: Any, sitting: Sitting) -> None:
    """Every chosen router in order, then the table; exit status 1 if any router failed."""
    args, out = sitting.args, sitting.progress
    stopping: list[bool] = []  # Ctrl-C or SIGTERM: the reactor is on its way out
    reactor.addSystemEventTrigger("before", "shutdown", stopping.append, True)
    ran = []
    for router in args.routers:
        if stopping:
            print(f"interrupted: {router} and the routers after it not run", file=out)
            break
        if router not in sitting.skipped:
            ran.append(await run_router(reactor, sitting, router))
    rows = with_ratios(sorted(ran, key=lambda r: ROUTERS.index(r.router)))
    if args.json:
        document = {
            "workload": {
                "conversations": args.conversations,
                "turns": args.turns,
                "at_once": args.at_once,
                "max_tokens": Workload.max_tokens,
                "hosts": args.hosts,
            },
            "order": [r.router for r in ran],
            "skipped": sitting.skipped,
            "load_before": sitting.load_before,
            "logs": str(sitting.work),
            "rows": [asdict(r) for r in rows],
        }
        print(json.dumps(document, indent=2))
    else:
        print(file=out)
        report(rows, out)
        for name, reason in sitting.skipped.items():
            print(f"{name}: skipped ({reason})", file=out)
    if any(r.error for r in rows):
        raise SystemExit(1)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; `--routers` is a comma-separated list of ROUTERS."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--routers", default=",".join(ROUTERS), help="comma-separated, of: %(default)s")
    p.add_argument("--hosts", type=int, default=3, help="llama-servers per router")
    p.add_argument("--conversations", type=int, default=9)
    p.add_argument("--turns", type=int, default=5, help="turns per conversation")
    p.add_argument("--at-once", type=int, default=3, help="conversations running at a time")
    p.add_argument(
        "--order",
        choices=("given", "reverse"),
        default="given",
        help="run the routers in --routers' order or reversed (alternate between sittings)",
    )
    p.add_argument(
        "--crossbar-python",
        default=sys.executable,
        help="the Python of the venv whose twistd runs crossbar (default: this one)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = p.parse_args(argv)
    args.routers = [r.strip() for r in args.routers.split(",") if r.strip()]
    unknown = sorted(set(args.routers) - set(ROUTERS))
    if unknown or not args.routers:
        p.error(f"--routers: unknown {', '.join(unknown) or '(none given)'}; known: {ROUTERS}")
    if args.order == "reverse":
        args.routers.reverse()
    if min(args.hosts, args.conversations, args.turns, args.at_once) < 1:
        p.error("--hosts, --conversations, --turns and --at-once must be at least 1")
    args.llama_server = os.environ.get("LLAMA_SERVER") or str(LLAMA_SERVER)
    args.llama_model = os.environ.get("LLAMA_MODEL") or str(LLAMA_MODEL)
    for what, path in (("LLAMA_SERVER", args.llama_server), ("LLAMA_MODEL", args.llama_model)):
        if not Path(path).is_file():
            p.error(f"{what}: no {path} (run `make real`, or set {what})")
    if "crossbar" in args.routers and not (Path(args.crossbar_python).parent / "twistd").exists():
        p.error(f"--crossbar-python: no twistd beside {args.crossbar_python}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Install the peers asked for, then run one sitting in this process's reactor."""
    args = parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    load_before = os.getloadavg()
    skipped = peer_routers.install_all([r for r in args.routers if r in PEERS], out)
    load = " ".join(f"{x:.2f}" for x in load_before)
    print(f"load average before: {load}; {os.cpu_count()} cores", file=out)
    if "crossbar" in args.routers:
        print(f"crossbar from {crossbar_checkout(args.crossbar_python)}", file=out)

    def body(processes: Processes, work: Path) -> int:
        print(f"logs of every process in {work}", file=out, flush=True)
        sitting = Sitting(args, processes, work, out, skipped, load_before)
        began = time.monotonic()
        status = react(lambda reactor: run_sitting(reactor, sitting))
        print(f"the sitting took {time.monotonic() - began:.0f} s", file=out)
        return status

    return with_processes("real-cache", body, keep=True)


if __name__ == "__main__":
    sys.exit(main())
