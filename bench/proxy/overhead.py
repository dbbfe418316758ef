"""Benchmark crossbar's overhead: one fake llama-server hit directly and through crossbar.

    .venv/bin/python bench/proxy/overhead.py [--duration 5] [--warmup 1] [--concurrency 1,32]
        [--json] [--trace-to none|sink|hang|refuse]

Starts `crossbar-fakellama` (64 slots, no token delay, a short reply) and crossbar under twistd
(one route in front of that fake, 64 slots, a temporary db) as processes of their own, then, for
each concurrency and for JSON and streamed answers, runs N workers that send chat requests back
to back for `--duration` seconds after a discarded `--warmup`, first straight to the fake, then
through crossbar. Each worker is a conversation of its own (its own first user message), so
crossbar keeps one lease per worker, as with real clients. Prints requests/s, latency (whole
answer) and time to first body byte, each with crossbar/direct ratios, and the CPU each process
used during the measured window (in % of one core). `--trace-to` turns crossbar's `[tracing]` on,
its spans going to a collector that takes them (`sink`, a process of its own answering every
export), one that never answers (`hang`: a socket that listens and never accepts) or a port
nobody listens on (`refuse`); `none`, the default, leaves tracing off.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from twisted.internet import defer
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from bench.common.measure import (
    BytesProducer,
    Reader,
    cpu_seconds,
    percentile,
    react,
    start_fast_fake,
    with_processes,
)
from crossbar.demo.launch import free_ports, wait_ready
from crossbar.demo.plan import read_plan
from crossbar.demo.processes import Process, Processes, command, wait_for_line

MODEL = "qwen-coder"
ROUTE = "bench"
SLOTS = 64  # of the fake and of crossbar's host: neither queues at c32
START_SECONDS = 30.0

CONFIG = """\
[server]
listen = "tcp:{listen}:interface=127.0.0.1"
admin_listen = "tcp:{admin}:interface=127.0.0.1"
db = "{db}"
default_route = "{route}"
health_interval = "1h"
health_timeout = "5s"
shutdown_grace = "1s"
handoff_store = "{handoff_store}"

[hosts.fake]
url = "{url}"
models = ["{model}"]
parallel = {slots}
ctx = 8192

[routes.{route}]
hosts = ["fake"]
default_model = "{model}"
affinity = "conversation"
{tracing}"""
TRACING = """
[tracing]
endpoint = "{endpoint}"
timeout = "2s"
"""
# A collector that takes every export and answers it, as fast as Python's http.server can.
SINK = """\
import http.server, sys
class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink)
print("sink listening", flush=True)
server.serve_forever()
"""


@dataclass
class Result:
    """One combination's numbers; times in milliseconds, CPU in % of one core."""

    target: str
    concurrency: int
    mode: str
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    rps: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    ttfb_p50_ms: float = 0.0
    ttfb_p99_ms: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    first_error: str = ""


def chat_body(worker: int, stream: bool) -> bytes:
    """A small chat request; each worker's first user message differs (its own conversation)."""
    messages = [
        {"role": "system", "content": "You are a terse assistant for a benchmark."},
        {"role": "user", "content": f"Worker {worker}: say hello and count to three."},
    ]
    return json.dumps({"model": MODEL, "messages": messages, "stream": stream}).encode()


async def one_request(
    agent: Agent, clock: Any, url: bytes, body: bytes, stream: bool
) -> tuple[float, float, float]:
    """Send one request; (start, first body byte, end) in reactor seconds. Raises on a bad
    status or a body that is not a whole answer."""
    headers = Headers({b"Content-Type": [b"application/json"]})
    started = clock.seconds()
    response: IResponse = await agent.request(b"POST", url, headers, BytesProducer(body))
    reader = Reader(clock)
    response.deliverBody(reader)
    data = await reader.done
    ended = clock.seconds()
    if response.code != 200:
        raise ValueError(f"HTTP {response.code}: {data[:200]!r}")
    if stream and not data.rstrip().endswith(b"data: [DONE]"):
        raise ValueError(f"stream without [DONE]: {data[-200:]!r}")
    if not stream and b'"choices"' not in data:
        raise ValueError(f"no choices: {data[:200]!r}")
    return started, reader.first if reader.first is not None else ended, ended


async def run_one(
    reactor: Any,
    result: Result,
    url: str,
    duration: float,
    warmup: float,
    pids: dict[str, int | None],
) -> Result:
    """Run `result.concurrency` workers against `url` for warmup + duration; fill `result`."""
    stream = result.mode == "stream"
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = result.concurrency
    pool.retryAutomatically = False
    agent = Agent(reactor, pool=pool)
    now = reactor.seconds()
    measure_from, end = now + warmup, now + warmup + duration
    samples: list[tuple[float, float, float]] = []
    cpu: list[dict[str, float]] = []  # at the start and the end of the measured window

    def mark_cpu() -> None:
        cpu.append({name: cpu_seconds(pid) for name, pid in pids.items()})

    reactor.callLater(warmup, mark_cpu)
    reactor.callLater(warmup + duration, mark_cpu)

    async def worker(n: int) -> None:
        body = chat_body(n, stream)
        while reactor.seconds() < end:
            try:
                sample = await one_request(agent, reactor, url.encode(), body, stream)
            except Exception as e:
                result.errors += 1
                result.first_error = result.first_error or f"{type(e).__name__}: {e}"
                continue
            if sample[0] >= measure_from and sample[2] <= end:
                samples.append(sample)

    await defer.gatherResults(
        [defer.ensureDeferred(worker(n)) for n in range(result.concurrency)], consumeErrors=True
    )
    await pool.closeCachedConnections()
    result.seconds = duration
    result.requests = len(samples)
    result.rps = len(samples) / duration
    latency = [(e - s) * 1000 for s, _, e in samples]
    ttfb = [(f - s) * 1000 for s, f, _ in samples]
    result.p50_ms, result.p99_ms = percentile(latency, 50), percentile(latency, 99)
    result.ttfb_p50_ms, result.ttfb_p99_ms = percentile(ttfb, 50), percentile(ttfb, 99)
    if len(cpu) == 2:
        result.cpu = {name: 100 * (cpu[1][name] - cpu[0][name]) / duration for name in pids}
    return result


async def run_all(
    reactor: Any,
    args: argparse.Namespace,
    urls: dict[str, str],
    pids: dict[str, int | None],
    progress: TextIO,
) -> None:
    """Every combination, direct then crossbar for each, then the report (on stdout)."""
    results: list[Result] = []
    for concurrency in args.concurrency:
        for mode in ("json", "stream"):
            for target in ("direct", "crossbar"):
                result = Result(target, concurrency, mode)
                await run_one(reactor, result, urls[target], args.duration, args.warmup, pids)
                results.append(result)
                line = f"  {target:<8} c{concurrency:<3} {mode:<6} {result.rps:8.0f} req/s"
                print(f"{line}, {result.errors} errors", file=progress, flush=True)
    answer, reader = await Agent(reactor).request(b"GET", urls["leases"].encode()), Reader(reactor)
    answer.deliverBody(reader)
    leases = json.loads(await reader.done)["total"]  # the page holds at most 100
    print(f"crossbar holds {leases} leases (one per worker conversation)", file=progress)
    report(results, args.json)


RATIO_KEYS = ("rps", "p50_ms", "p99_ms", "ttfb_p50_ms", "ttfb_p99_ms")


def ratios(results: list[Result]) -> list[dict[str, Any]]:
    """crossbar/direct for each (concurrency, mode), plus the p50 overhead in ms."""
    by_key = {(r.target, r.concurrency, r.mode): r for r in results}
    rows = []
    for r in results:
        if r.target != "crossbar" or ("direct", r.concurrency, r.mode) not in by_key:
            continue
        d = by_key[("direct", r.concurrency, r.mode)]
        row: dict[str, Any] = {"concurrency": r.concurrency, "mode": r.mode}
        for k in RATIO_KEYS:
            base = getattr(d, k)
            row[k] = getattr(r, k) / base if base else None
        row["added_p50_ms"] = r.p50_ms - d.p50_ms
        row["added_ttfb_p50_ms"] = r.ttfb_p50_ms - d.ttfb_p50_ms
        rows.append(row)
    return rows


def report(results: list[Result], as_json: bool) -> None:
    """Print the results (and ratios) as aligned tables, or as one JSON document."""
    rows = ratios(results)
    if as_json:
        print(json.dumps({"results": [asdict(r) for r in results], "ratios": rows}, indent=2))
        return
    print()
    head = (
        f"{'target':<9}{'conc':>5} {'mode':<7}{'req/s':>8}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'ttfb p50':>10}{'ttfb p99':>10}{'errors':>8}   cpu % (gen/fake/crossbar)"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        cpu = "/".join(f"{r.cpu.get(k, 0):.0f}" for k in ("gen", "fake", "crossbar"))
        print(
            f"{r.target:<9}{r.concurrency:>5} {r.mode:<7}{r.rps:>8.0f}{r.p50_ms:>9.2f}"
            f"{r.p99_ms:>9.2f}{r.ttfb_p50_ms:>10.2f}{r.ttfb_p99_ms:>10.2f}{r.errors:>8}   {cpu}"
        )
    print()
    head = (
        f"{'crossbar/direct':<16}{'req/s':>7}{'p50':>7}{'p99':>7}{'ttfb p50':>10}{'ttfb p99':>10}"
        f"{'+p50 ms':>9}{'+ttfb p50 ms':>14}"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        cells = "".join(
            f"{row[k]:>{w}.2f}" if row[k] is not None else f"{'-':>{w}}"
            for k, w in zip(RATIO_KEYS, (7, 7, 7, 10, 10), strict=True)
        )
        label = f"c{row['concurrency']} {row['mode']}"
        print(f"{label:<16}{cells}{row['added_p50_ms']:>9.2f}{row['added_ttfb_p50_ms']:>14.2f}")
    for r in results:
        if r.first_error:
            print(f"first error of {r.target} c{r.concurrency} {r.mode}: {r.first_error}")


def collector(processes: Processes, trace_to: str, held: list[socket.socket]) -> str:
    """The `[tracing]` table for `--trace-to` ("" for none); a hanging socket goes to `held`,
    to stay open while the bench runs."""
    if trace_to == "none":
        return ""
    if trace_to == "hang":
        listening = socket.socket()
        listening.bind(("127.0.0.1", 0))
        listening.listen(1024)  # never accepted: every export waits for its timeout
        held.append(listening)
        port = listening.getsockname()[1]
    else:
        (port,) = free_ports(1)  # "refuse": nothing listens there
        if trace_to == "sink":
            sink = processes.start("sink", [sys.executable, "-c", SINK, str(port)])
            wait_for_line(sink, r"sink listening", time.monotonic() + START_SECONDS)
    return TRACING.format(endpoint=f"http://127.0.0.1:{port}/v1/traces")


def start(
    processes: Processes,
    work: Path,
    reply_tokens: int,
    handoff_store: str = "0",
    tracing: str = "",
) -> tuple[dict[str, str], Process]:
    """Start the fake, then crossbar in front of it; their URLs once crossbar answers."""
    fake, fake_url = start_fast_fake(processes, MODEL, SLOTS, reply_tokens)
    listen, admin = free_ports(2)
    config = work / "bench.toml"
    config.write_text(
        CONFIG.format(
            listen=listen,
            admin=admin,
            db=work / "crossbar.db",
            route=ROUTE,
            url=fake_url,
            model=MODEL,
            slots=SLOTS,
            handoff_store=handoff_store,
            tracing=tracing,
        )
    )
    twistd = command("twistd")
    proxy = processes.start("crossbar", [twistd, "-n", "--pidfile=", "crossbar", "-c", str(config)])
    plan = read_plan(config, ROUTE)
    wait_ready(plan, proxy)  # polls /r/bench/health with a deadline
    path = "/v1/chat/completions"
    leases = f"{plan.admin_url}api/leases?route={ROUTE}"
    return {"direct": fake_url + path, "crossbar": plan.route_url(path), "leases": leases}, fake


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; `--concurrency` is a comma-separated list."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=1.0, help="discarded seconds before each run")
    p.add_argument("--concurrency", default="1,32", help="comma-separated worker counts")
    p.add_argument("--reply-tokens", type=int, default=16, help="tokens in each fake answer")
    p.add_argument(
        "--handoff-store", default="0", help='crossbar\'s server.handoff_store ("1GiB": on)'
    )
    p.add_argument(
        "--trace-to",
        choices=("none", "sink", "hang", "refuse"),
        default="none",
        help="crossbar's [tracing]: off, or spans to a collector that takes, hangs or refuses",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = p.parse_args(argv)
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        p.error(f"--concurrency: not a list of integers: {args.concurrency!r}")
    if not args.concurrency or min(args.concurrency) < 1 or args.duration <= 0:
        p.error("--concurrency needs positive integers and --duration a positive number")
    return args


def main(argv: list[str] | None = None) -> int:
    """Start the processes, run every combination in this process's reactor, stop them."""
    args = parse_args(argv)
    progress = sys.stderr if args.json else sys.stdout

    held: list[socket.socket] = []

    def body(processes: Processes, work: Path) -> int:
        tracing = collector(processes, args.trace_to, held)
        urls, fake = start(processes, work, args.reply_tokens, args.handoff_store, tracing)
        proxy = processes.started[-1]
        print(
            f"fake at {urls['direct']}, crossbar at {urls['crossbar']}", file=progress, flush=True
        )
        pids = {"gen": None, "fake": fake.pid, "crossbar": proxy.pid}
        return react(lambda r: run_all(r, args, urls, pids, progress))

    return with_processes("overhead", body)


if __name__ == "__main__":
    sys.exit(main())
