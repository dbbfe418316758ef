"""Benchmark many concurrent SSE streams through one crossbar: CPU per relayed chunk, the gap
between tokens it adds, and its memory.

    .venv/bin/python bench/proxy/streams.py [--streams 200,1000] [--rate 20] [--duration 10]
                                      [--runs 1] [--resume-attempts 1] [--json]

The source is bench/proxy/sse_source.py (pre-built chunks written on a timer, 20 a second per
stream), the client is asyncio in this process (raw HTTP/1.1, one connection per stream).
For each N, N streams are read straight from the source, then through crossbar (twistd, one
route, a lease per conversation, usage rows to SQLite): started over one second, measured for
`--duration` seconds after a two-second warm-up. Printed per party: chunks received, the gap between
consecutive chunk arrivals (p50, p99), each process's CPU in % of one core; for crossbar, its
CPU per relayed chunk (µs), the p99 gap it adds over direct, and its RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.fleet.scale import CLK_TCK, TWISTD, cpu_seconds, wait_http
from crossbar.demo.launch import free_ports

HERE = Path(__file__).parent
MODEL = "bench-model"
CONFIG = """\
[server]
listen = "tcp:{port}:interface=127.0.0.1"
admin_listen = "tcp:{admin}:interface=127.0.0.1"
db = "{db}"
default_route = "bench"
health_interval = "5s"
shutdown_grace = "1s"

[hosts.source]
url = "http://127.0.0.1:{upstream}"
parallel = {parallel}
ctx = 1000000
models = ["{model}"]

[routes.bench]
hosts = ["source"]
resume_attempts = {resume}
"""


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Reader:
    """All streams' arrivals: gaps and chunk counts inside the measured window."""

    def __init__(self) -> None:
        self.window = (float("inf"), float("inf"))
        self.gaps: list[float] = []
        self.chunks = 0
        self.errors = 0
        self.statuses: set[str] = set()

    async def stream(self, port: int, path: str, i: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        turn = {"role": "user", "content": f"Conversation {i}: refactor the parser."}
        body = json.dumps({"model": MODEL, "stream": True, "messages": [turn]}).encode()
        head = b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        writer.write(head % path.encode() + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        loop = asyncio.get_running_loop()
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            self.errors += 1
            self.statuses.add(head.split(b"\r\n", 1)[0].decode("latin-1"))
            writer.close()
            return
        last = None
        while True:
            data = await reader.read(65536)
            now = loop.time()
            if not data:
                break
            start, end = self.window  # set once every stream has started
            if start <= now < end:
                self.chunks += data.count(b"data: ")
                if last is not None:
                    self.gaps.append(now - last)
            last = now
            if b"[DONE]" in data or now >= end:
                break
        writer.close()


async def run_streams(port: int, path: str, n: int, args: argparse.Namespace,
                      pid: int | None) -> dict[str, Any]:  # fmt: skip
    """n streams, the window measured; CPU of `pid` (the proxy) and of this process."""
    loop = asyncio.get_running_loop()
    reader = Reader()
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(reader.stream(port, path, i)))
        await asyncio.sleep(1.0 / n)  # spread over one second (longer on a busy machine)
    t0 = loop.time()
    reader.window = (t0 + args.warmup, t0 + args.warmup + args.duration)
    await asyncio.sleep(max(0.0, reader.window[0] - loop.time()))
    cpu0, own0, peak = cpu_seconds(pid) if pid else 0.0, time.process_time(), 0.0
    await asyncio.sleep(args.duration / 2)
    peak = rss_mb(pid) if pid else 0.0
    await asyncio.sleep(max(0.0, reader.window[1] - loop.time()))
    cpu1, own1 = cpu_seconds(pid) if pid else 0.0, time.process_time()
    await asyncio.gather(*tasks, return_exceptions=True)
    gaps = sorted(reader.gaps) or [0.0]
    return {
        "streams": n, "chunks": reader.chunks, "errors": reader.errors,
        "gap_p50_ms": 1000 * gaps[len(gaps) // 2],
        "gap_p99_ms": 1000 * gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))],
        "proxy_cpu_percent": 100 * (cpu1 - cpu0) / args.duration if pid else None,
        "us_per_chunk": 1e6 * (cpu1 - cpu0) / max(reader.chunks, 1) if pid else None,
        "client_cpu_percent": 100 * (own1 - own0) / args.duration,
        "statuses": sorted(reader.statuses),
        "rss_mb": peak,
    }  # fmt: skip


def start(cmd: list[str], work: Path, name: str) -> subprocess.Popen:
    log = (work / f"{name}.log").open("w")
    return subprocess.Popen(cmd, cwd=work, stdout=log, stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()


def one_n(n: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    upstream, port, admin = free_ports(3)
    tokens = int(args.rate * (args.warmup + args.duration + 10))  # the ramp may be slow
    source = start([sys.executable, str(HERE / "sse_source.py"), str(upstream), "--rate",
                    str(args.rate), "--tokens", str(tokens)], work, f"source-{n}")  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{upstream}/health")
        s0 = cpu_seconds(source.pid)
        direct = asyncio.run(run_streams(upstream, "/v1/chat/completions", n, args, None))
        direct["source_cpu_percent"] = 100 * (cpu_seconds(source.pid) - s0) / (
            args.warmup + args.duration + 1)  # fmt: skip
        config = work / f"crossbar-{n}.toml"
        config.write_text(CONFIG.format(port=port, admin=admin, db=work / f"cb-{n}.db",
                                        upstream=upstream, parallel=max(64, 2 * n),
                                        model=MODEL, resume=args.resume_attempts))  # fmt: skip
        crossbar = start([TWISTD, "-n", "--pidfile=", "crossbar", "-c", str(config)], work,
                         f"crossbar-{n}")  # fmt: skip
        try:
            wait_http(f"http://127.0.0.1:{admin}/api/status")
            relayed = asyncio.run(
                run_streams(port, "/r/bench/v1/chat/completions", n, args, crossbar.pid)
            )
        finally:
            stop(crossbar)
    finally:
        stop(source)
    relayed["added_gap_p99_ms"] = relayed["gap_p99_ms"] - direct["gap_p99_ms"]
    return {"direct": direct, "crossbar": relayed}


def report(rows: list[dict[str, Any]]) -> None:
    print("| N | party | chunks | gap p50 ms | gap p99 ms | added p99 ms | crossbar cpu % "
          "| µs/chunk | RSS MB | client cpu % | errors |")  # fmt: skip
    print("|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for row in rows:
        for party in ("direct", "crossbar"):
            r = row[party]
            cb = party == "crossbar"
            print(f"| {r['streams']} | {party} | {r['chunks']} | {r['gap_p50_ms']:.1f} "
                  f"| {r['gap_p99_ms']:.1f} | {r['added_gap_p99_ms'] if cb else 0:.1f} "
                  f"| {r['proxy_cpu_percent'] if cb else 0:.0f} "
                  f"| {r['us_per_chunk'] if cb else 0:.1f} | {r['rss_mb'] if cb else 0:.0f} "
                  f"| {r['client_cpu_percent']:.0f} | {r['errors']} |")  # fmt: skip
    by_n: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_n.setdefault(row["crossbar"]["streams"], []).append(row["crossbar"])
    if any(len(v) > 1 for v in by_n.values()):
        print("\n| N | runs | median µs/chunk | median added p99 ms | median RSS MB |")
        print("|--:|--:|--:|--:|--:|")
        for n, rs in by_n.items():
            med = {k: statistics.median(r[k] for r in rs)
                   for k in ("us_per_chunk", "added_gap_p99_ms", "rss_mb")}  # fmt: skip
            print(f"| {n} | {len(rs)} | {med['us_per_chunk']:.1f} "
                  f"| {med['added_gap_p99_ms']:.1f} | {med['rss_mb']:.0f} |")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="200,1000", help="comma-separated N")
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    # 0: crossbar relays each stream without reading its text (nothing can be continued);
    # the default 1 keeps each stream's transcript for a continuation (issue 50).
    parser.add_argument("--resume-attempts", type=int, default=1)
    args = parser.parse_args(argv)
    assert CLK_TCK > 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="crossbar-streams-") as tmp:
        for run in range(args.runs):
            for n in (int(x) for x in args.streams.split(",")):
                work = Path(tmp) / f"run-{run}-{n}"
                work.mkdir()
                try:
                    rows.append(one_n(n, args, work))
                except SystemExit:
                    for log in sorted(work.glob("*.log")):
                        print(f"--- {log.name}\n{log.read_text()[-2000:]}", file=sys.stderr)
                    raise
                r = rows[-1]["crossbar"]
                print(f"  run {run + 1}, {n} streams: {r['us_per_chunk']:.1f} µs/chunk",
                      file=sys.stderr)  # fmt: skip
    print(json.dumps(rows, indent=2)) if args.json else report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
