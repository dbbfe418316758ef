"""The in-process scenarios of bench/fleet/fleet.py: the store and the lease table alone, on an
SQLite file (`expiry`: mass expiry of idle leases; `store_burst`: a burst of new leases)."""

from __future__ import annotations

import argparse
import gc
import inspect
import shutil
import tempfile
from pathlib import Path
from typing import Any

from twisted.internet import defer, task

from bench.common.measure import percentile


def ms(values: list[float]) -> str:
    return (
        f"p50 {percentile(values, 50) * 1000:.1f} ms, p99 {percentile(values, 99) * 1000:.1f} "
        f"ms, max {max(values, default=0) * 1000:.1f} ms ({len(values)})"
    )


async def store_burst(reactor: Any, args: argparse.Namespace) -> None:
    """`--burst` new leases (Table.acquire) and as many usage rows at once, in this process,
    on an SQLite file: what the store's commits cost, without HTTP."""
    from crossbar.leases.chooser import Chooser
    from crossbar.leases.journal import Journal
    from crossbar.leases.table import Key, Table
    from crossbar.records import UsageRow
    from crossbar.store.database import Store

    work = Path(tempfile.mkdtemp(prefix="crossbar-burst-"))
    store = await Store.open(str(work / "b.db"), reactor)
    try:
        table = await Table.load(store, Up(), Chooser(Slots()), 3600.0, Journal(store, reactor))
        waits: list[float] = []

        async def conversation(i: int) -> None:
            t0 = reactor.seconds()
            got = await table.acquire(Key("r", f"c{i}", "m"), ["a", "b"], 1.0)
            waits.append(reactor.seconds() - t0)
            row = UsageRow(1.0, "r", f"c{i}", "m", got.host, "/v1/chat/completions", 200, False)
            await store.record_usage(row)

        t0 = reactor.seconds()
        await defer.gatherResults(
            [defer.ensureDeferred(conversation(i)) for i in range(args.burst)]
        )
        total = reactor.seconds() - t0
        groups = getattr(getattr(store, "group", None), "groups", None) or "one per write"
        print(
            f"{args.burst} new leases + usage rows at once (store only): all in "
            f"{total * 1000:.0f} ms; lease saved after {ms(waits)}; transactions: {groups}"
        )
    finally:
        await store.close()
        shutil.rmtree(work, ignore_errors=True)


class Slots:
    def parallel(self, host: str, model: str) -> int:
        return 4

    def free_slots(self, host: str, model: str) -> int:
        return 4


class Up:
    def healthy(self, name: str) -> bool:
        return True

    def draining(self, name: str) -> bool:
        return False


async def expiry(reactor: Any, args: argparse.Namespace) -> None:
    from crossbar.leases.chooser import Chooser
    from crossbar.leases.journal import Journal
    from crossbar.leases.table import Key, Lease, State, Table
    from crossbar.leases.types import Change
    from crossbar.store.database import Store

    work = Path(tempfile.mkdtemp(prefix="crossbar-expiry-"))
    store = await Store.open(str(work / "e.db"), reactor)
    try:
        rows = [Lease(Key("r", f"fp{i}", "m"), "a", State.ACTIVE, 0.0, 0.0)
                for i in range(args.leases)]  # fmt: skip
        for start in range(0, len(rows), 20_000):
            await store.apply(save=rows[start : start + 20_000])
        table = await Table.load(store, Up(), Chooser(Slots()), 3600.0, Journal(store, reactor))
        del rows
        from crossbar.app import wiring

        freeze_from = getattr(wiring, "_FREEZE_FROM", None)  # as crossbar does at start, if it does
        if freeze_from is not None and len(table) >= freeze_from:
            gc.collect()
            gc.freeze()
        batched = "batch" in inspect.signature(table.expire_idle).parameters
        gaps, waits, last = [0.0], [], [reactor.seconds()]

        def tick() -> None:
            now = reactor.seconds()
            gaps.append(now - last[0])
            last[0] = now

        async def writer() -> None:
            n = 0
            while not done.called:
                lease = Lease(Key("w", f"x{n}", "m"), "a", State.ACTIVE, 1e9, 1e9)
                t0 = reactor.seconds()
                await store.write(Change(save=[lease]))
                waits.append(reactor.seconds() - t0)
                n += 1
                await task.deferLater(reactor, 0.01, lambda: None)

        ticker = task.LoopingCall(tick)
        ticker.start(0.002)
        now = 1e6
        sweep = table.expire_idle(now, args.batch) if batched else table.expire_idle(now)
        t0 = reactor.seconds()
        done = defer.ensureDeferred(sweep)
        w = defer.ensureDeferred(writer())
        expired = await done
        took = reactor.seconds() - t0
        await w
        ticker.stop()
        how = f"batches of {args.batch}" if batched else "one transaction"
        print(f"{args.leases} idle leases expired ({expired}) in {took * 1000:.0f} ms "
              f"({how}): longest reactor stall "
              f"{max(gaps) * 1000:.0f} ms; lease writes meanwhile {ms(waits)}")  # fmt: skip
    finally:
        await store.close()
        shutil.rmtree(work, ignore_errors=True)


async def probe_lag(reactor: Any, args: argparse.Namespace, ports: list[str]) -> None:
    """199 hosts probed in this process, every 1 s, in rounds (all at once, as before) and on
    the spread schedule: the reactor's gaps between 5 ms ticks over `--duration` seconds."""
    import time

    from crossbar.app.service import probe_timer
    from crossbar.config.values import parse_config
    from crossbar.hosts.registry import Hosts

    hosts = {f"h{i:03}": {"url": url, "models": ["m"], "parallel": 1, "ctx": 8192}
             for i, url in enumerate(ports)}  # fmt: skip
    config = parse_config({"server": {"health_interval": "1s"}, "hosts": hosts})
    for mode in ("rounds", "spread"):
        probed = Hosts(config, reactor)
        await probed.probe_all()
        if mode == "rounds":
            timer: Any = task.LoopingCall(probed.probe_all)
            timer.start(1.0)
        else:
            timer = probe_timer(config, probed, reactor)
            timer.startService()
        gaps: list[float] = []
        ticker = task.LoopingCall(_tick, gaps, [time.perf_counter()])
        ticker.start(0.005)
        cpu = time.process_time()
        await task.deferLater(reactor, args.duration, lambda: None)
        ticker.stop()
        timer.stop() if mode == "rounds" else timer.stopService()
        await probed.stop()
        cpu = 100 * (time.process_time() - cpu) / args.duration
        print(f"199 hosts, {mode}: reactor gaps {ms(gaps)}; CPU {cpu:.0f}%")


def _tick(gaps: list[float], last: list[float]) -> None:
    import time

    now = time.perf_counter()
    gaps.append(now - last[0])
    last[0] = now


async def probe_cpu(reactor: Any, args: argparse.Namespace, ports: list[str]) -> None:
    """CPU per health probe, treq against the lean getter (probe_http.py), alternately:
    `--rounds` rounds of 199 hosts probed at once (the state machine's own work included)."""
    import time

    from crossbar.config.values import parse_config
    from crossbar.hosts.health import build_client, treq_getter
    from crossbar.hosts.registry import Hosts

    hosts = {f"h{i:03}": {"url": url, "models": ["m"], "parallel": 1, "ctx": 8192}
             for i, url in enumerate(ports)}  # fmt: skip
    config = parse_config({"server": {"health_interval": "1s"}, "hosts": hosts})
    for mode in ("treq", "lean", "treq", "lean"):
        if mode == "treq":
            http, pool = build_client(reactor)
            probed = Hosts(config, reactor, get=treq_getter(http))
        else:
            probed, pool = Hosts(config, reactor), None
        await probed.probe_all()  # connections opened, /props read
        cpu = time.process_time()
        for _ in range(args.rounds):
            await probed.probe_all()
        cpu = time.process_time() - cpu
        healthy = sum(probed.healthy(name) for name in hosts)
        lean = getattr(probed, "_lean", None)  # None: treq, or a crossbar without probe_http
        how = f"; {lean.connects} connections, {lean.fallbacks} via treq" if lean else ""
        await probed.stop()
        if pool is not None:
            await pool.closeCachedConnections()
        probes = args.rounds * len(hosts)
        print(
            f"{mode}: {probes} probes, {1e6 * cpu / probes:.0f} µs CPU each; {healthy} healthy{how}"
        )
