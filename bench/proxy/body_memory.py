"""Benchmark what request bodies cost crossbar in memory: 1-byte chunks, then many slow uploads.

    .venv/bin/python bench/proxy/body_memory.py [--clients 150] [--body-mib 2] [--piece-kib 64]
                                          [--interval-ms 50,100] [--chunked-mib 1] [--json]
                                          [--checkout DIR]

Starts `crossbar-fakellama` (64 slots, no token delay, a short reply) and crossbar under twistd
(one route in front of that fake, `max_body = "8MiB"`, `max_body_memory = "256MiB"`, a
temporary db) as processes of their own, the checkout they run being `--checkout` (by default
the one this script is in; it goes first on their PYTHONPATH). Then, as in issue 38:

1. Unless `--chunked-mib 0`: one connection sends a chat request of `--chunked-mib` MiB as a
   chunked body of 1-byte chunks, as fast as crossbar reads them. It goes first: its growth
   would hide under what the uploads leave behind.
2. `--clients` connections each upload a chat request whose user message is `--body-mib` MiB of
   text (with its `Content-Length`), slowly: `--piece-kib` KiB at a time, a piece every
   `--interval-ms` (each client its own pace within the range, and its own start within the
   first interval), so each upload takes a few seconds and they overlap. Some may get 503
   (`max_body_memory`): every status is counted.

crossbar's RSS (VmRSS of its twistd process) is sampled every 100 ms. Printed for each phase, in
MB: what crossbar held before it (before the first: after one small request and a second of
rest), its peak from the first byte sent to the last answer, and what it holds 2 s and 10 s
after that answer; with the seconds the phase took to its last answer, the CPU seconds crossbar
used in them, and the statuses.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from twisted.internet import defer, task
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure

from bench.common.measure import (
    cpu_seconds,
    crossbar_checkout,
    react,
    start_fast_fake,
    with_processes,
)
from crossbar.demo.launch import free_ports, wait_ready
from crossbar.demo.plan import read_plan
from crossbar.demo.processes import Processes, command

MODEL = "qwen-coder"
ROUTE = "bench"
SLOTS = 64
SAMPLE_SECONDS = 0.1
PATH = f"/r/{ROUTE}/v1/chat/completions"
MB = 1_000_000  # RSS is reported in MB (10^6 bytes); bodies are sized in MiB

CONFIG = """\
[server]
listen = "tcp:{listen}:interface=127.0.0.1"
admin_listen = "tcp:{admin}:interface=127.0.0.1"
db = "{db}"
default_route = "{route}"
health_interval = "1h"
health_timeout = "5s"
shutdown_grace = "1s"
max_body = "{max_body}"
max_body_memory = "{max_body_memory}"
queue_max = 1024

[hosts.fake]
url = "{url}"
models = ["{model}"]
parallel = {slots}
ctx = 8192

[routes.{route}]
hosts = ["fake"]
default_model = "{model}"
affinity = "conversation"
"""


@dataclass
class Phase:
    """One phase's figures: RSS in MB, times and CPU in seconds, statuses by code."""

    name: str
    bodies: int = 0
    body_mib: float = 0.0
    rss_before: float = 0.0
    rss_peak: float = 0.0
    rss_after_2s: float = 0.0
    rss_after_10s: float = 0.0
    seconds: float = 0.0
    crossbar_cpu_s: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)


def rss_bytes(pid: int) -> int:
    """VmRSS of `pid`, in bytes (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Sampler:
    """VmRSS of a process every 100 ms, for as long as the bench runs."""

    def __init__(self, reactor: Any, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, int]] = []
        self.clock = reactor
        self.loop = task.LoopingCall(self.sample)
        self.loop.clock = reactor
        self.loop.start(SAMPLE_SECONDS)

    def sample(self) -> int:
        value = rss_bytes(self.pid)
        self.samples.append((self.clock.seconds(), value))
        return value

    def peak(self, since: float) -> float:
        """The highest sample since reactor time `since` (and now's), in MB."""
        now = self.sample()
        return max([now, *(v for t, v in self.samples if t >= since)]) / MB

    def stop(self) -> None:
        if self.loop.running:
            self.loop.stop()


def filler(size: int) -> bytes:
    """`size` bytes of JSON-safe text: words of about 1 KiB (so the fake's tokenizer sees a
    couple of thousand tokens for 2 MiB, not half a million)."""
    word = (b"abcdefghijklmnopqrstuvwxyz" * 40)[:1023] + b" "
    return (word * (size // len(word) + 1))[:size]


def chat_parts(client: int) -> tuple[bytes, bytes]:
    """A chat request around a user message, as (the JSON before the message's filler, the
    JSON after it); each client's message starts with its own words."""
    before = json.dumps({"model": MODEL, "max_tokens": 16, "messages": [{"role": "user"}]})
    head, tail = before.rsplit("}]}", 1)
    prefix = f'{head}, "content": "Client {client} uploads slowly. '.encode()
    return prefix, b'"}]}' + tail.encode()


def request_head(port: int, headers: dict[str, str]) -> bytes:
    lines = [f"POST {PATH} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    lines += ["Content-Type: application/json", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class Upload(Protocol):
    """Sends `pieces` one per `interval` after `delay` (the first with the request head), and
    stops sending if the connection closes; `done` fires with the answer's status ("closed"
    for a connection closed without one)."""

    def __init__(
        self, reactor: Any, pieces: Sequence[bytes], delay: float, interval: float
    ) -> None:
        self.reactor = reactor
        self.pieces = pieces
        self.delay, self.interval = delay, interval
        self.sent = 0
        self.timer: Any = None
        self.answer = bytearray()
        self.done: defer.Deferred[str] = defer.Deferred()

    def connectionMade(self) -> None:
        self.timer = self.reactor.callLater(self.delay, self.send)

    def send(self) -> None:
        self.timer = None
        self.transport.write(self.pieces[self.sent])
        self.sent += 1
        if self.sent < len(self.pieces):
            self.timer = self.reactor.callLater(self.interval, self.send)

    def dataReceived(self, data: bytes) -> None:
        if len(self.answer) < 4096:
            self.answer += data

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        first = bytes(self.answer).split(b"\r\n", 1)[0].split()
        self.done.callback(first[1].decode() if len(first) > 1 else "closed")


async def upload(reactor: Any, port: int, pieces: Sequence[bytes], delay: float, gap: float) -> str:
    """One upload on a connection of its own; its status."""
    try:
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
        protocol = await connectProtocol(endpoint, Upload(reactor, pieces, delay, gap))
    except Exception as e:
        return f"connect: {type(e).__name__}"
    return await protocol.done


class SlowPieces:
    """The writes of one slow upload, cut as they are sent (so that 150 uploads share one
    filler): its head with the JSON before the filler, then the filler `piece` bytes at a
    time, the last with the JSON after it."""

    def __init__(self, client: int, port: int, body_size: int, piece: int) -> None:
        self.prefix, self.suffix = chat_parts(client)
        size = body_size - len(self.prefix) - len(self.suffix)
        self.head = request_head(port, {"Content-Length": str(body_size)})
        if size not in FILLERS:
            FILLERS[size] = filler(size)
        self.filler = FILLERS[size]
        self.piece = piece
        self.count = 1 + -(-size // piece)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, n: int) -> bytes:
        if n == 0:
            return self.head + self.prefix
        data = self.filler[(n - 1) * self.piece : n * self.piece]
        return data + self.suffix if n == self.count - 1 else data


FILLERS: dict[int, bytes] = {}


def one_byte_chunks(port: int, body_size: int, batch: int = 16384) -> list[bytes]:
    """A chunked request whose body (a chat request of `body_size` bytes) is sent as 1-byte
    chunks, `batch` chunks to a write."""
    prefix, suffix = chat_parts(0)
    body = prefix + filler(body_size - len(prefix) - len(suffix)) + suffix
    writes = [request_head(port, {"Transfer-Encoding": "chunked"})]
    for start in range(0, len(body), batch):
        writes.append(b"".join(b"1\r\n%c\r\n" % b for b in body[start : start + batch]))
    writes.append(b"0\r\n\r\n")
    return writes


async def sleep(reactor: Any, seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


async def settle(reactor: Any, phase: Phase, sampler: Sampler, started: float) -> None:
    """Note the phase's peak since `started`, then what crossbar holds 2 s and 10 s later."""
    phase.rss_peak = sampler.peak(started)
    await sleep(reactor, 2)
    phase.rss_after_2s = sampler.sample() / MB
    await sleep(reactor, 8)
    phase.rss_after_10s = sampler.sample() / MB


async def slow_uploads(
    reactor: Any, args: argparse.Namespace, port: int, pid: int, sampler: Sampler
) -> Phase:
    """`--clients` slow uploads at once."""
    size = int(args.body_mib * 1024 * 1024)
    piece = args.piece_kib * 1024
    low, high = args.interval_ms
    phase = Phase("slow uploads", args.clients, args.body_mib)
    phase.rss_before = sampler.sample() / MB
    started, cpu = reactor.seconds(), cpu_seconds(pid)
    uploads = []
    for n in range(args.clients):
        gap = (low + (high - low) * (n % 11) / 10) / 1000
        delay = gap * (n % 7) / 7
        pieces = SlowPieces(n, port, size, piece)
        uploads.append(defer.ensureDeferred(upload(reactor, port, pieces, delay, gap)))
    statuses = await defer.gatherResults(uploads, consumeErrors=True)
    ended = reactor.seconds()
    phase.seconds = ended - started
    phase.crossbar_cpu_s = cpu_seconds(pid) - cpu
    phase.statuses = dict(sorted(Counter(statuses).items()))
    await settle(reactor, phase, sampler, started)
    return phase


async def chunked_upload(
    reactor: Any, args: argparse.Namespace, port: int, pid: int, sampler: Sampler
) -> Phase:
    """One body of 1-byte chunks, written as fast as the connection takes it."""
    phase = Phase("1-byte chunks", 1, args.chunked_mib)
    writes = one_byte_chunks(port, int(args.chunked_mib * 1024 * 1024))
    phase.rss_before = sampler.sample() / MB
    started, cpu = reactor.seconds(), cpu_seconds(pid)
    status = await upload(reactor, port, writes, 0.0, 0.005)
    phase.seconds = reactor.seconds() - started
    phase.crossbar_cpu_s = cpu_seconds(pid) - cpu
    phase.statuses = {status: 1}
    await settle(reactor, phase, sampler, started)
    return phase


async def small_request(reactor: Any, port: int) -> str:
    """One ordinary chat request (the warm-up before the baseline); its status."""
    prefix, suffix = chat_parts(-1)
    body = prefix + b"hello" + suffix
    head = request_head(port, {"Content-Length": str(len(body))})
    return await upload(reactor, port, [head + body], 0.0, 0.0)


async def run_all(
    reactor: Any, args: argparse.Namespace, port: int, pid: int, progress: TextIO
) -> None:
    status = await small_request(reactor, port)
    if status != "200":
        raise RuntimeError(f"the warm-up request got {status}")
    await sleep(reactor, 1)
    sampler = Sampler(reactor, pid)
    phases = []
    if args.chunked_mib > 0:
        phases.append(await chunked_upload(reactor, args, port, pid, sampler))
        print(f"  1-byte chunks done: {phases[-1].statuses}", file=progress, flush=True)
    phases.append(await slow_uploads(reactor, args, port, pid, sampler))
    print(f"  slow uploads done: {phases[-1].statuses}", file=progress, flush=True)
    sampler.stop()
    report(phases, args)


def report(phases: list[Phase], args: argparse.Namespace) -> None:
    """The phases as one table (RSS in MB), or as JSON."""
    if args.json:
        options = {k: v for k, v in vars(args).items() if k != "json"}
        print(json.dumps({"options": options, "phases": [asdict(p) for p in phases]}, indent=2))
        return
    print()
    head = (
        f"{'phase':<14}{'bodies':>7}{'MiB':>5}{'RSS before':>12}{'peak':>8}{'+2 s':>8}"
        f"{'+10 s':>8}{'seconds':>9}{'CPU s':>7}   statuses"
    )
    print(head)
    print("-" * len(head))
    for p in phases:
        statuses = ", ".join(f"{k}: {v}" for k, v in p.statuses.items())
        print(
            f"{p.name:<14}{p.bodies:>7}{p.body_mib:>5g}{p.rss_before:>12.0f}{p.rss_peak:>8.0f}"
            f"{p.rss_after_2s:>8.0f}{p.rss_after_10s:>8.0f}{p.seconds:>9.1f}{p.crossbar_cpu_s:>7.1f}"
            f"   {statuses}"
        )
    print(f"(RSS of crossbar's process in MB; max_body_memory = {args.max_body_memory})")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, default=150, help="slow uploads at once")
    p.add_argument("--body-mib", type=float, default=2.0, help="size of each slow upload's body")
    p.add_argument("--piece-kib", type=int, default=64, help="bytes of a slow upload per write")
    p.add_argument(
        "--interval-ms", default="50,100", help="the range of a slow upload's time between writes"
    )
    p.add_argument(
        "--chunked-mib", type=float, default=1.0, help="the 1-byte-chunk body's size (0: no phase)"
    )
    p.add_argument("--max-body", default="8MiB", help="crossbar's server.max_body")
    p.add_argument("--max-body-memory", default="256MiB", help="crossbar's server.max_body_memory")
    p.add_argument(
        "--checkout",
        default=str(Path(__file__).resolve().parents[2]),
        help="the crossbar checkout the processes run (first on their PYTHONPATH)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    try:
        low, high = (float(x) for x in args.interval_ms.split(","))
    except ValueError:
        p.error(f"--interval-ms: not two numbers: {args.interval_ms!r}")
    if args.clients < 1 or args.body_mib <= 0 or args.piece_kib < 1 or not 0 < low <= high:
        p.error("--clients, --body-mib, --piece-kib and --interval-ms need positive values")
    args.interval_ms = (low, high)
    return args


def main(argv: list[str] | None = None) -> int:
    """Start the processes, run both phases in this process's reactor, stop them."""
    args = parse_args(argv)
    progress = sys.stderr if args.json else sys.stdout
    paths = [args.checkout, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)  # for the processes started below
    print(f"crossbar from {crossbar_checkout(sys.executable)}", file=progress, flush=True)

    def body(processes: Processes, work: Path) -> int:
        _, url = start_fast_fake(processes, MODEL, SLOTS)
        listen, admin = free_ports(2)
        config = work / "bench.toml"
        config.write_text(
            CONFIG.format(
                listen=listen,
                admin=admin,
                db=work / "crossbar.db",
                route=ROUTE,
                url=url,
                model=MODEL,
                slots=SLOTS,
                max_body=args.max_body,
                max_body_memory=args.max_body_memory,
            )
        )
        twistd = command("twistd")
        proxy = processes.start(
            "crossbar", [twistd, "-n", "--pidfile=", "crossbar", "-c", str(config)]
        )
        wait_ready(read_plan(config, ROUTE), proxy)
        print(f"fake at {url}, crossbar at port {listen}", file=progress, flush=True)
        return react(lambda r: run_all(r, args, listen, proxy.pid, progress))

    return with_processes("body-memory", body)


if __name__ == "__main__":
    sys.exit(main())
