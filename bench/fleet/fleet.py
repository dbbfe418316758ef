"""Fleet dynamics (issue 23): many hosts, a flapping host, mass expiry, a burst of new
conversations. Each scenario starts every party itself and prints its numbers.

    .venv/bin/python bench/fleet/fleet.py probes  [--duration 20]   # 3 vs 200 hosts at 1 s probes
    .venv/bin/python bench/fleet/fleet.py lag     [--duration 15]   # reactor gaps: rounds vs spread
    .venv/bin/python bench/fleet/fleet.py probe-cpu [--rounds 20]   # CPU per probe: treq vs lean
    .venv/bin/python bench/fleet/fleet.py quiet   [--duration 10]   # log lines/s, 199 hosts down
    .venv/bin/python bench/fleet/fleet.py flap    [--duration 120]  # one host down 2 s / up 2 s
    .venv/bin/python bench/fleet/fleet.py expiry  [--leases 100000] [--batch N] # idle leases expire
    .venv/bin/python bench/fleet/fleet.py burst   [--burst 1000]    # new conversations at once
    .venv/bin/python bench/fleet/fleet.py store-burst [--burst 1000] # the same, store only
    .venv/bin/python bench/fleet/fleet.py reads [--usage-rows 1000000] # lease writes beside reports

`probes`, `quiet`, `flap` and `burst` run crossbar under twistd in front of
`crossbar-fakellama` processes; the many hosts of `probes`/`quiet` are one process of this
script listening on 199 ports (`serve-health`), answering /health and /props. `expiry` runs
the store and the lease table in this process and measures the reactor's longest stall and
the wait of lease writes made meanwhile. Run with PYTHONPATH=<other checkout> to measure
another crossbar (the "before" figures of docs/performance.md were taken so on main).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from twisted.internet import defer, task
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.http_headers import Headers

from bench.common.measure import BytesProducer, Reader, cpu_seconds
from bench.fleet.fleet_reads import reads
from bench.fleet.fleet_store import expiry, ms, probe_cpu, probe_lag, store_burst
from crossbar.config.values import ServerConfig
from crossbar.demo.launch import free_ports
from crossbar.demo.processes import Processes, command, wait_for_line

MODEL = "qwen-coder"
START = 60.0
SERVER = """[server]
listen = "tcp:{listen}:interface=127.0.0.1"
admin_listen = "tcp:{admin}:interface=127.0.0.1"
db = "{db}"
health_interval = "{interval}"
health_timeout = "2s"
shutdown_grace = "1s"
queue_max = 2000
"""
HOST = '[hosts.{name}]\nurl = "{url}"\nmodels = ["{model}"]\nparallel = {parallel}\nctx = 8192\n'
ROUTE = '[routes.bench]\nhosts = [{hosts}]\ndefault_model = "{model}"\n'


class Party:
    """Processes of one run in a temporary directory: fakes, the health ports, crossbar."""

    def __init__(self) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="crossbar-fleet-"))
        self.processes = Processes(self.work, record_pids=False)
        self.base = self.admin = ""
        self.crossbar: Any = None

    def fake(self, name: str, parallel: int = 64) -> tuple[str, str]:
        """A crossbar-fakellama; (its URL, its control URL)."""
        argv = [command("crossbar-fakellama"), "--port", "0", "--control-port", "0"]
        argv += ["--model", MODEL, "--parallel", str(parallel), "--ctx", "8192"]
        argv += ["--tokens-per-second", "0", "--reply-tokens", "8"]
        p = self.processes.start(name, argv)
        deadline = time.monotonic() + START
        url = wait_for_line(p, r" at (http://\S+)", deadline)[1]
        control = wait_for_line(p, r"\(control (http://[^)\s]+)\)", deadline)[1]
        return url, control

    def health_ports(self, n: int) -> list[str]:
        argv = [sys.executable, __file__, "serve-health", str(n)]
        p = self.processes.start("health-ports", argv)
        ports = wait_for_line(p, r"ports: (\S+)", time.monotonic() + START)[1].split(",")
        return [f"http://127.0.0.1:{port}" for port in ports]

    def start(self, hosts: dict[str, str], route: list[str], interval: str, parallel: int) -> None:
        listen, admin = free_ports(2)
        text = SERVER.format(listen=listen, admin=admin, db=self.work / "c.db", interval=interval)
        for name, url in hosts.items():
            text += HOST.format(name=name, url=url, model=MODEL, parallel=parallel)
        text += ROUTE.format(hosts=", ".join(f'"{h}"' for h in route), model=MODEL)
        (self.work / "c.toml").write_text(text)
        argv = [command("twistd"), "-n", "--pidfile=", "crossbar", "-c", str(self.work / "c.toml")]
        self.crossbar = self.processes.start("crossbar", argv)
        wait_for_line(self.crossbar, r"crossbar listening", time.monotonic() + START)
        self.base = f"http://127.0.0.1:{listen}/r/bench"
        self.admin = f"http://127.0.0.1:{admin}"

    def log_lines(self) -> int:
        return len(self.crossbar.log.read_text(errors="replace").splitlines())

    def stop(self) -> None:
        self.processes.stop()
        shutil.rmtree(self.work, ignore_errors=True)


def agent(reactor: Any, n: int) -> Agent:
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = n
    pool.retryAutomatically = False
    return Agent(reactor, pool=pool)


async def call(ag: Agent, reactor: Any, method: bytes, url: str, body: bytes | None = None):
    """(status, headers, body, seconds)."""
    started = reactor.seconds()
    headers = Headers({b"Content-Type": [b"application/json"]})
    producer = BytesProducer(body) if body is not None else None
    response = await ag.request(method, url.encode(), headers, producer)
    reader = Reader(reactor)
    response.deliverBody(reader)
    data = await reader.done
    return response.code, response.headers, data, reactor.seconds() - started


async def post_chat(ag: Agent, reactor: Any, party: Party, conversation: str):
    """One chat turn of `conversation` through crossbar: (status, headers, body, seconds)."""
    return await call(ag, reactor, b"POST", party.base + "/v1/chat/completions", chat(conversation))


def chat(conversation: str) -> bytes:
    messages = [{"role": "user", "content": f"conversation {conversation}: say hello"}]
    return json.dumps({"model": MODEL, "messages": messages}).encode()


async def probes(reactor: Any, args: argparse.Namespace) -> None:
    for n in (3, 200):
        party = Party()
        try:
            url, _ = party.fake("fake")
            hosts = {"fake": url}
            others = party.health_ports(n - 1)
            hosts.update({f"h{i:03}": u for i, u in enumerate(others)})
            party.start(hosts, ["fake"], "1s", 64)
            await run_probes(reactor, party, n, args.duration)
        finally:
            party.stop()


async def run_probes(reactor: Any, party: Party, n: int, duration: float) -> None:
    ag = agent(reactor, 16)
    await task.deferLater(reactor, 3, lambda: None)
    end = reactor.seconds() + duration
    proxied: list[float] = []
    health: list[float] = []

    async def worker(i: int) -> None:
        while reactor.seconds() < end:
            *_, took = await post_chat(ag, reactor, party, f"w{i}")
            proxied.append(took)

    async def health_checker() -> None:
        while reactor.seconds() < end:
            *_, took = await call(ag, reactor, b"GET", party.base + "/health")
            health.append(took)
            await task.deferLater(reactor, 0.05, lambda: None)

    lines, cpu = party.log_lines(), cpu_seconds(party.crossbar.pid)
    work = [defer.ensureDeferred(worker(i)) for i in range(4)]
    await defer.gatherResults([*work, defer.ensureDeferred(health_checker())])
    logged = party.log_lines() - lines
    cpu = 100 * (cpu_seconds(party.crossbar.pid) - cpu) / duration
    scrapes, size = [], 0
    for _ in range(5):
        _, _, body, took = await call(ag, reactor, b"GET", party.admin + "/metrics")
        scrapes.append(took)
        size = len(body)
    _, _, _, hosts_took = await call(ag, reactor, b"GET", party.admin + "/api/hosts")
    print(f"{n} hosts, health_interval 1s, {duration:g} s, 4 conversations back to back:")
    print(f"  proxied chat:        {ms(proxied)}")
    print(f"  crossbar's /health:  {ms(health)}")
    print(f"  /metrics: {size / 1024:.0f} KiB, {ms(scrapes)}")
    print(f"  /api/hosts: {hosts_took * 1000:.1f} ms")
    print(
        f"  log lines: {logged / duration:.2f}/s (a request log line each); crossbar CPU {cpu:.0f}%"
    )


async def lag(reactor: Any, args: argparse.Namespace) -> None:
    party = Party()
    try:
        await probe_lag(reactor, args, party.health_ports(199))
    finally:
        party.stop()


async def probe_cost(reactor: Any, args: argparse.Namespace) -> None:
    party = Party()
    try:
        await probe_cpu(reactor, args, party.health_ports(199))
    finally:
        party.stop()


async def quiet(reactor: Any, args: argparse.Namespace) -> None:
    party = Party()
    try:
        url, _ = party.fake("fake")
        hosts = {"fake": url}
        hosts.update({f"h{i:03}": f"http://127.0.0.1:{p}" for i, p in enumerate(free_ports(199))})
        party.start(hosts, ["fake"], "1s", 1)
        await task.deferLater(reactor, 10, lambda: None)  # every down host has flipped
        lines = party.log_lines()
        await task.deferLater(reactor, args.duration, lambda: None)
        rate = (party.log_lines() - lines) / args.duration
        print(f"199 hosts down, 1 up, health_interval 1s: {rate:.2f} log lines/s")
    finally:
        party.stop()


async def flap(reactor: Any, args: argparse.Namespace) -> None:
    party = Party()
    try:
        urls = {name: party.fake(name) for name in ("steady1", "steady2", "flappy")}
        party.start({n: u for n, (u, _) in urls.items()}, list(urls), "1s", 64)
        ag = agent(reactor, 64)
        control = urls["flappy"][1] + "/_fake/faults"
        end = reactor.seconds() + args.duration
        placed: dict[str, int] = {}
        conversations: list[str] = []

        async def flapper() -> None:
            down = False
            while reactor.seconds() < end:
                down = not down
                await call(ag, reactor, b"POST", control, json.dumps({"refuse": down}).encode())
                await task.deferLater(reactor, 2, lambda: None)
            await call(ag, reactor, b"POST", control, b'{"refuse": false}')

        async def conversation(name: str) -> None:
            while reactor.seconds() < end:
                _, headers, _, _ = await post_chat(ag, reactor, party, name)
                if name not in conversations:
                    conversations.append(name)
                    host = (headers.getRawHeaders(b"x-crossbar-host") or [b"-"])[0].decode()
                    placed[host] = placed.get(host, 0) + 1
                await task.deferLater(reactor, 1, lambda: None)

        running = [defer.ensureDeferred(flapper())]
        i = 0
        while reactor.seconds() < end:
            running.append(defer.ensureDeferred(conversation(f"c{i}")))
            i += 1
            await task.deferLater(reactor, 0.5, lambda: None)
        await defer.gatherResults(running, consumeErrors=True)
        _, _, body, _ = await call(ag, reactor, b"GET", party.admin + "/api/events?limit=1000")
        events = json.loads(body)["events"]
        moved = sum(1 for e in events if e["from_host"] == "flappy" and e["reason"] == "unhealthy")
        print(f"flapping host (2 s down / 2 s up) for {args.duration:g} s: {len(conversations)} "
              f"new conversations, placed {placed}; {moved} moved off flappy again")  # fmt: skip
    finally:
        party.stop()


async def burst(reactor: Any, args: argparse.Namespace) -> None:
    party = Party()
    try:
        url, _ = party.fake("fake", parallel=args.burst + 24)
        party.start({"fake": url}, ["fake"], "5s", args.burst + 24)
        ag = agent(reactor, args.burst)
        # Open the client's connections first (a listen backlog overflowing is not what is
        # measured): one round of other conversations, whose connections the pool then keeps.
        await defer.gatherResults(
            [
                defer.ensureDeferred(post_chat(ag, reactor, party, f"warm{i}"))
                for i in range(args.burst)
            ]
        )
        fake = next(p for p in party.processes.started if p.name == "fake")
        pids = {"crossbar": party.crossbar.pid, "fake": fake.pid, "client": os.getpid()}
        cpu = {name: cpu_seconds(pid) for name, pid in pids.items()}
        started = reactor.seconds()
        calls = [
            defer.ensureDeferred(post_chat(ag, reactor, party, f"burst{i}"))
            for i in range(args.burst)
        ]
        results = await defer.gatherResults(calls)
        total = reactor.seconds() - started
        bad = sum(1 for status, *_ in results if status != 200)
        print(f"{args.burst} new conversations at once: all done in {total * 1000:.0f} ms, "
              f"{ms([r[3] for r in results])}, {bad} not 200")  # fmt: skip
        used = {name: cpu_seconds(pid) - cpu[name] for name, pid in pids.items()}
        print("CPU during the burst: " + ", ".join(
            f"{name} {seconds * 1000:.0f} ms ({seconds * 1e6 / args.burst:.0f} µs a request)"
            for name, seconds in used.items()))  # fmt: skip
    finally:
        party.stop()


def serve_health(reactor: Any, n: int) -> defer.Deferred[None]:
    """`n` ports answering /health 200 and /props like a llama-server with one slot."""
    from twisted.web.resource import Resource
    from twisted.web.server import Site

    class Health(Resource):
        isLeaf = True

        def render_GET(self, request: Any) -> bytes:
            request.setHeader(b"content-type", b"application/json")
            if request.path == b"/props":
                return b'{"total_slots": 1, "default_generation_settings": {"n_ctx": 8192}}'
            return b'{"status": "ok"}'

    site = Site(Health())
    site.noisy = False
    ports = [reactor.listenTCP(0, site, interface="127.0.0.1") for _ in range(n)]
    print("ports: " + ",".join(str(p.getHost().port) for p in ports), flush=True)
    return defer.Deferred()  # until killed


SCENARIOS = {
    "probes": probes,
    "lag": lag,
    "probe-cpu": probe_cost,
    "quiet": quiet,
    "flap": flap,
    "burst": burst,
    "store-burst": store_burst,
    "expiry": expiry,
    "reads": reads,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=[*SCENARIOS, "serve-health"])
    parser.add_argument("n", nargs="?", type=int, default=199)
    parser.add_argument("--duration", type=float, default=None)
    parser.add_argument("--leases", type=int, default=100_000)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--usage-rows", type=int, default=1_000_000)  # reads
    parser.add_argument("--rounds", type=int, default=20)  # probe-cpu
    parser.add_argument("--batch", type=int, default=ServerConfig().sweep_batch)  # expiry
    args = parser.parse_args()
    if args.scenario == "serve-health":
        task.react(lambda reactor: serve_health(reactor, args.n))
        return
    defaults = {"probes": 20.0, "lag": 15.0, "quiet": 10.0, "flap": 120.0, "reads": 10.0}
    args.duration = args.duration or defaults.get(args.scenario, 0.0)
    fn = SCENARIOS[args.scenario]
    task.react(lambda reactor: defer.ensureDeferred(fn(reactor, args)))


if __name__ == "__main__":
    main()
