"""Benchmark the lease table: acquires per second and the load time of a big database.

    .venv/bin/python bench/fleet/lease_table.py [--leases 100000] [--db PATH]

Builds N leases (100 routes x N/100 conversations over 8 hosts) in a SQLite file, loads a table
from it, then times acquire for existing leases (no write, and with a last_used write), and for
new leases (one write each), one at a time and with many in flight. Times are wall clock and,
for a machine shared with other work, the process's CPU time as well.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from twisted.internet import defer, task

from crossbar.leases.chooser import Chooser
from crossbar.leases.table import Key, Lease, State, Table
from crossbar.store.database import Store

HOSTS = [f"h{i}" for i in range(8)]
ROUTES = 100
IDLE = 7200.0
T0 = 1_700_000_000.0


class AllHealthy:
    def healthy(self, name: str) -> bool:
        return True

    def draining(self, name: str) -> bool:
        return False


class FourSlots:
    def parallel(self, host: str, model: str) -> int:
        return 4

    def free_slots(self, host: str, model: str) -> int:
        return 0


def megabytes(path: str) -> float:
    return os.path.getsize(path) / 1e6


def candidates(route: int) -> list[str]:
    return [HOSTS[(route + i) % len(HOSTS)] for i in range(4)]


def key(route: int, conversation: int) -> Key:
    return Key(f"route-{route}", f"{conversation:016x}", "qwen-coder")


async def load(path: str, reactor) -> tuple[Table, Store, float, float]:
    started = time.perf_counter()
    store = await Store.open(path, reactor)
    opened = time.perf_counter()
    cpu = time.process_time()
    table = await Table.load(store, AllHealthy(), Chooser(FourSlots()), IDLE)
    print(f"Table.load: {time.process_time() - cpu:.2f} s of CPU (all threads)")
    return table, store, opened - started, time.perf_counter() - started


async def rate(
    label: str, calls: list[Callable[[], Awaitable[object]]], in_flight: int = 1
) -> None:
    started, cpu = time.perf_counter(), time.process_time()
    for i in range(0, len(calls), in_flight):
        await defer.gatherResults([defer.ensureDeferred(c()) for c in calls[i : i + in_flight]])
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    # By CPU too: on a shared machine the wall clock counts other processes' time.
    print(
        f"  {label:<58} {len(calls) / seconds:>10,.0f} /s  ({len(calls):,} in {seconds:.2f} s;"
        f" {len(calls) / cpu:,.0f} /s of CPU)"
    )


async def main(reactor, n: int, path: str, build: bool) -> None:
    per_route = n // ROUTES
    if build:
        store = await Store.open(path, reactor)
        started = time.perf_counter()
        leases = [
            Lease(key(r, c), candidates(r)[c % 4], State.ACTIVE, T0, T0)
            for r in range(ROUTES)
            for c in range(per_route)
        ]
        await store.apply(save=leases)
        await store.close()
        seconds = time.perf_counter() - started
        print(f"built {len(leases):,} leases in {seconds:.2f} s ({megabytes(path):.1f} MB)")

    table, store, open_s, load_s = await load(path, reactor)
    print(f"load: Store.open {open_s * 1000:.0f} ms, Store.open + Table.load {load_s:.2f} s")
    assert len(table) == per_route * ROUTES

    keys = [key(r, c) for c in range(per_route) for r in range(ROUTES)]
    cands = {r: candidates(r) for r in range(ROUTES)}

    def reuse(k: Key, now: float):
        return lambda: table.acquire(k, cands[int(k.route[6:])], now)

    sample = keys[:20_000]
    new = [Key(k.route, "new-" + k.fp, k.model) for k in sample]
    cases = [
        ("existing lease (no write: last_used saved lazily)", keys, 1.0, 1),
        ("existing lease, last_used written (one at a time)", sample, 100.0, 1),
        ("existing lease, last_used written (256 in flight)", sample, 200.0, 256),
        ("new lease, one write each (one at a time)", new[:10_000], 300.0, 1),
        ("new lease, one write each (256 in flight)", new[10_000:], 300.0, 256),
    ]
    print("acquire:")
    for label, some, dt, in_flight in cases:
        await rate(label, [reuse(k, T0 + dt) for k in some], in_flight)
    await store.close()


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", type=int, default=100_000)
    parser.add_argument("--db", help="SQLite file to build (default: a temporary one)")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="use the --db a previous run built with the same --leases (the build of a "
        "million takes minutes; comparing two versions' load needs only one)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.db or os.path.join(tmp, "bench.db")
        build = not (args.reuse and args.db and Path(path).exists())
        if build:
            for suffix in ("", "-wal", "-shm"):
                Path(path + suffix).unlink(missing_ok=True)
        task.react(lambda reactor: defer.ensureDeferred(main(reactor, args.leases, path, build)))


if __name__ == "__main__":
    run()
