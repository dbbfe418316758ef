"""How long a host's slot stands idle when it frees while a request waits: crossbar's queue
beside the host's own (issue 37, item 6).

    .venv/bin/python bench/proxy/slot_handoff.py [--targets direct,crossbar,nginx] [--handoffs 2000]
        [--clients 4] [--gen-ms 10] [--tokens 8] [--stream] [--rounds 4] [--warmup 100]
        [--crossbar-python .venv/bin/python] [--crossbar-b-python OTHER/.venv/bin/python]
        [--stamps] [--pin] [--keep] [--json]

One sitting, one host: bench/proxy/slot_host.py, a one-slot stand-in for llama-server that answers
each chat completion after `--gen-ms` of "generation" (one JSON body, or with `--stream` an
SSE stream of `--tokens` events) and notes with `time.monotonic_ns()` when each request's
first byte was read (`arrived`), when its slot took it (`taken`) and when the last byte of its
answer went (`ended`, read just before that send()). `--clients` clients on kept connections
loop chat completions (each its own conversation, every request named by an `X-Bench-Id`
header and its sending time noted on the same clock) at one of the targets:

- `direct`: at the host itself, which queues what comes while its slot is busy, in arrival
  order, and takes the next one the moment an answer ends (as llama-server does);
- `crossbar`: `twistd -n crossbar -c <config>` from `--crossbar-python`'s venv, the host
  configured with `parallel = 1`, one route, a temporary SQLite file: crossbar queues, and
  sends the next request when the slot frees;
- `crossbar-b`, with `--crossbar-b-python`: the same from another venv (another checkout, say
  one with a patch), taking turns with the others in the same sitting;
- `nginx`: nginx as a plain proxy (bench/common/nginx-proxy.conf); it never queues (open-source
  nginx cannot hold a request for a busy upstream), so every request goes on to the host at once
  over a kept connection of its own and the host's queue does the hand-off, as behind
  vllm-router or smg. Skipped, said why, when `nginx` is not on PATH.

With one slot and two or more clients there is always a request waiting; a hand-off is
counted for each two answers k, k+1 in the slot's order whose request k+1 had been sent before
answer k ended. Each target runs `--warmup` requests first (not counted), then the targets take
turns, `--rounds` rounds of `--handoffs / --rounds` requests each (the order reversed every
other round), so a change in the machine's load falls on all of them.

Prints the load average before the sitting, then per target: the hand-offs counted; the
slot's idle time at each (`taken` of k+1 minus `ended` of k: what a hand-off costs the host)
as p50, p90, p99 and max in microseconds; the same for the request's first byte (`arrived`
of k+1 minus `ended` of k: for a target that queues in front of the host, the time from the
host's last byte to its next request's first byte; for one that does not, the request was
already there and the figure is "-"); the p50 beyond `direct`'s; the share of hand-offs
whose next request came on the connection the answer had just ended on; the connections the
host accepted while measuring (a direct client's own not counted); requests a second; the
CPU microseconds per request of the proxy's process (`bench/common/measure.py` `cpu_seconds`) and
how often per request its main thread was switched out while it could have run (another
process took its CPU: on 2 cores, mostly the client it had just written to).

`--stamps` runs crossbar under bench/proxy/crossbar_stamps.py and adds a table: crossbar's hand-offs
split at its stamps (the reactor's wake-up, the answer read, the relay's end, the release, the
waiter's send), each segment's wall time p50/p90/p99 and the reactor thread's CPU time in it
p50/p90. The stamps cost crossbar a few microseconds each. `--pin` keeps the host and the
clients on CPU 0 and the proxy on CPU 1. `--keep` keeps the directory of logs, configs and
stamps (`crossbar-stamps.json`, `crossbar-windows.json`), otherwise removed after a good
sitting.
`--json` prints it all as JSON instead. Ports come from 24500-24999. A default sitting takes
about 2 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httptools
from twisted.internet import defer
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure

from bench.common.measure import (
    cpu_seconds,
    crossbar_checkout,
    react,
    with_processes,
)
from bench.proxy.handoff_figures import PERCENTILES, SEGMENTS, Handoff, Spread, breakdown, handoffs
from bench.proxy.slot_handoff_stage import (
    MODEL,
    PATH,
    Sitting,
    Target,
    crossbar_python,
    host_process,
    host_records,
    pin,
    preemptions,
    start_crossbar,
    start_host,
    start_nginx,
)
from crossbar.demo.processes import Processes, stop
from crossbar.wire.twisted_private import write_now

TARGETS = ("direct", "crossbar", "crossbar-b", "nginx")
CROSSBARS = ("crossbar", "crossbar-b")

# --- the clients ------------------------------------------------------------------------------


@dataclass
class RoundResult:
    """What one round's clients saw: each request's sending time by bench id, answers, errors."""

    sent: dict[str, int] = field(default_factory=dict)
    answered: int = 0
    errors: int = 0
    seconds: float = 0.0
    cpu: float | None = None
    preempted: int = 0
    load: float = 0.0


@dataclass
class Tally:
    """One target's measured rounds, added up."""

    handoffs: list[Handoff] = field(default_factory=list)
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    cpu: float | None = None  # the proxy's CPU seconds over the measured rounds
    preempted: int = 0  # times the proxy's main thread was switched out while it could run
    accepted: int = 0  # connections the host accepted while measuring
    load: list[float] = field(default_factory=list)  # 1-minute load average before each round

    def add(self, result: RoundResult, records: list[dict[str, Any]], accepted: int) -> None:
        """One measured round: its clients' result, the host's records of it, and the
        connections the host accepted meanwhile."""
        self.handoffs += handoffs(records, result.sent)
        self.requests += result.answered
        self.errors += result.errors
        self.seconds += result.seconds
        if result.cpu is not None:
            self.cpu = (self.cpu or 0.0) + result.cpu
        self.preempted += result.preempted
        self.accepted += accepted
        self.load.append(result.load)

    def summary(self, queues_in_front: bool) -> dict[str, Any]:
        """The target's figures (`first_byte_us` only for a target that queues in front of
        the host)."""
        idle = Spread.of([h.idle_ns / 1000 for h in self.handoffs])
        first = Spread.of([h.first_byte_ns / 1000 for h in self.handoffs])
        same = sum(h.same_connection for h in self.handoffs)
        return {
            "handoffs": len(self.handoffs),
            "idle_us": asdict(idle),
            "first_byte_us": asdict(first) if queues_in_front else None,
            "same_connection": same / len(self.handoffs) if self.handoffs else None,
            "host_connections": self.accepted,
            "requests": self.requests,
            "errors": self.errors,
            "requests_per_second": self.requests / self.seconds if self.seconds else 0.0,
            "cpu_us_per_request": (
                1e6 * self.cpu / self.requests if self.cpu is not None and self.requests else None
            ),
            "preempted_per_request": (
                self.preempted / self.requests if self.cpu is not None and self.requests else None
            ),
            "load_before_rounds": self.load,
        }


# Where crossbar's share of a hand-off goes (`--stamps`, bench/proxy/crossbar_stamps.py): from the
# host's last byte (its `ended`) through crossbar's stamps to the host reading the next request.
class Round:
    """`requests` chat completions shared out among the clients as they ask for the next."""

    def __init__(self, port: int, requests: int, stream: bool, tokens: int) -> None:
        self.port = port
        self.stream = stream
        self.tokens = tokens
        self.result = RoundResult()
        self._numbers = iter(range(requests))

    def take(self) -> int | None:
        """The next request's number, or None when the round has sent them all."""
        return next(self._numbers, None)

    def request(self, client: int, bench_id: str) -> bytes:
        """Client `client`'s chat completion (its own conversation), named `bench_id`."""
        body = json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"client {client}: say ok"}],
                "max_tokens": self.tokens,
                "stream": self.stream,
            }
        ).encode()
        head = (
            f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Content-Type: application/json\r\nX-Bench-Id: {bench_id}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body


class Client(Protocol):
    """One client on one kept connection: a request, its whole answer, the next request,
    while the round has some left."""

    def __init__(self, number: int, round_: Round) -> None:
        self.number = number
        self.round = round_
        self.done: defer.Deferred[None] = defer.Deferred()
        self._parser: Any = None
        self._id = ""

    def connectionMade(self) -> None:
        self.transport.setTcpNoDelay(True)  # type: ignore[attr-defined]
        self._next()

    def _next(self) -> None:
        number = self.round.take()
        if number is None:
            self._id = ""
            self.transport.loseConnection()
            return
        self._id = f"c{self.number}-{number}"
        self._parser = httptools.HttpResponseParser(self)
        data = self.round.request(self.number, self._id)
        self.round.result.sent[self._id] = time.monotonic_ns()
        write_now(self.transport, (data,))

    def dataReceived(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self.round.result.errors += 1
            self._id = ""
            self.transport.loseConnection()

    def on_message_complete(self) -> None:
        if self._parser.get_status_code() == 200:
            self.round.result.answered += 1
        else:
            self.round.result.errors += 1
        self._next()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self._id:  # cut before its answer ended
            self.round.result.errors += 1
        self.done.callback(None)


async def run_round(reactor: Any, round_: Round, clients: int, within: float) -> RoundResult:
    """The round's requests through `clients` clients; its result once all are answered."""
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", round_.port)
    started = reactor.seconds()
    made = [Client(i, round_) for i in range(clients)]
    for client in made:
        await connectProtocol(endpoint, client)
    finished = defer.gatherResults([c.done for c in made])
    await finished.addTimeout(within, reactor)
    round_.result.seconds = reactor.seconds() - started
    return round_.result


# --- the processes ----------------------------------------------------------------------------


# --- the sitting --------------------------------------------------------------------------------


async def measure_round(
    reactor: Any, sitting: Sitting, target: Target, host: int, requests: int
) -> tuple[RoundResult, list[dict[str, Any]], int]:
    """One round at `target`: its result, the host's records of it and the connections the
    host accepted meanwhile."""
    args = sitting.args
    _, accepted_before = await host_records(reactor, host)  # forget what came before
    load = os.getloadavg()[0]
    cpu_before = cpu_seconds(target.process.pid) if target.process else None
    preempted_before = preemptions(target.process.pid) if target.process else 0
    round_ = Round(target.port, requests, args.stream, args.tokens)
    timeout = 60 + requests * (args.gen_ms / 1000) * 5
    result = await run_round(reactor, round_, args.clients, timeout)
    if target.process is not None and cpu_before is not None:
        result.cpu = cpu_seconds(target.process.pid) - cpu_before
        result.preempted = preemptions(target.process.pid) - preempted_before
    result.load = load
    records, accepted = await host_records(reactor, host)
    accepted -= accepted_before + 1  # the records' own connection
    if target.process is None:
        accepted -= args.clients  # the clients' own, straight to the host
    return result, records, accepted


async def run_sitting(reactor: Any, sitting: Sitting) -> dict[str, Any]:
    """Start the host and the targets, warm each, measure them in turns, and (with
    `--stamps`) stop each crossbar and split its hand-offs at its stamps; the summary."""
    args, out = sitting.args, sys.stderr
    load = os.getloadavg()
    host = await start_host(reactor, sitting)
    targets = []
    for name in args.targets:
        if name == "direct":
            targets.append(Target("direct", host, None, queues_in_front=False))
        elif name in CROSSBARS:
            targets.append(await start_crossbar(reactor, sitting, host, name))
        elif name == "nginx":
            if shutil.which("nginx") is None:
                why = "nginx is not on PATH (Debian: apt-get install nginx-light)"
                sitting.skipped["nginx"] = why
                continue
            targets.append(await start_nginx(reactor, sitting, host))
    if args.pin:
        os.sched_setaffinity(0, {0})
        pin(host_process(sitting).pid, 0)
        for target in targets:
            if target.process is not None:
                pin(target.process.pid, 1)
    tallies = {t.name: Tally() for t in targets}
    for target in targets:
        print(f"{target.name}: warm-up, {args.warmup} requests", file=out, flush=True)
        await measure_round(reactor, sitting, target, host, args.warmup)
    per_round = max(args.clients + 1, args.handoffs // args.rounds)
    for n in range(args.rounds):
        for target in targets if n % 2 == 0 else reversed(targets):
            print(f"{target.name}: round {n + 1} of {args.rounds}", file=out, flush=True)
            result, records, accepted = await measure_round(
                reactor, sitting, target, host, per_round
            )
            tallies[target.name].add(result, records, accepted)
    summaries = {t.name: tallies[t.name].summary(t.queues_in_front) for t in targets}
    found = {}
    crossbars = [t for t in targets if t.name in CROSSBARS and t.process is not None]
    for crossbar in crossbars if args.stamps else []:
        assert crossbar.process is not None
        stop([crossbar.process])  # it writes its stamps as it stops
        stamps = json.loads((sitting.work / f"{crossbar.name}-stamps.json").read_text())
        handed = tallies[crossbar.name].handoffs
        windows = [(h.ended, h.ended + h.first_byte_ns) for h in handed]
        (sitting.work / f"{crossbar.name}-windows.json").write_text(json.dumps(windows))
        spent = breakdown(windows, [(label, t, cpu) for label, t, cpu in stamps])
        found[crossbar.name] = {
            "segments": {label: asdict(Spread.of(spent.wall[label])) for label, _ in SEGMENTS},
            "cpu": {label: asdict(Spread.of(spent.cpu[label])) for label, _ in SEGMENTS},
            "skipped": spent.skipped,
        }
    return {
        "load_before": list(load),
        "load_after": list(os.getloadavg()),
        "cpus": os.cpu_count(),
        "settings": {
            "clients": args.clients,
            "gen_ms": args.gen_ms,
            "tokens": args.tokens,
            "stream": args.stream,
            "handoffs": args.handoffs,
            "rounds": args.rounds,
            "warmup": args.warmup,
            "pinned": args.pin,
        },
        "targets": summaries,
        "checkouts": {t.name: crossbar_checkout(crossbar_python(args, t.name)) for t in crossbars},
        "skipped": sitting.skipped,
        "stamps": found,
    }


def _f(value: float | None, spec: str = ".0f") -> str:
    """`value` formatted, or "-" for none."""
    return "-" if value is None else format(value, spec)


def report(summary: dict[str, Any]) -> str:
    """The table `summary` (run_sitting's) prints as."""
    s = summary["settings"]
    load = " ".join(f"{x:.2f}" for x in summary["load_before"])
    after = " ".join(f"{x:.2f}" for x in summary["load_after"])
    shape = f"SSE, {s['tokens']} events" if s["stream"] else "one JSON body"
    lines = [
        f"load average before: {load} (after: {after}) on {summary['cpus']} CPUs",
        f"{s['clients']} clients, one slot, {s['gen_ms']:g} ms a generation, {shape}; "
        f"{s['rounds']} rounds, targets taking turns"
        + (", pinned (host and clients CPU 0, proxy CPU 1)" if s["pinned"] else ""),
        *(f"{name} from {where}" for name, where in summary["checkouts"].items()),
        "",
        "target     | hand-offs | slot idle µs p50/p90/p99/max | first byte µs p50/p90/p99/max "
        "| p50 beyond direct | same conn | host conns | req/s | proxy CPU µs/req | preempted/req",
    ]
    targets = summary["targets"]
    base = targets.get("direct", {}).get("idle_us", {}).get("p50")
    for name, t in targets.items():
        idle = t["idle_us"]
        first = t["first_byte_us"]
        spread = "/".join(_f(idle[k]) for k in PERCENTILES)
        firsts = "-" if first is None else "/".join(_f(first[k]) for k in PERCENTILES)
        beyond = "-" if base is None or name == "direct" else _f(idle["p50"] - base, "+.0f")
        same = "-" if t["same_connection"] is None else f"{100 * t['same_connection']:.0f}%"
        errors = f" ({t['errors']} errors)" if t["errors"] else ""
        lines.append(
            f"{name:<10} | {t['handoffs']:>9} | {spread:>28} | {firsts:>29} | {beyond:>17} | "
            f"{same:>9} | {t['host_connections']:>10} | {t['requests_per_second']:>5.0f} | "
            f"{_f(t['cpu_us_per_request']):>16} | {_f(t['preempted_per_request'], '.2f')}{errors}"
        )
    for name, why in summary["skipped"].items():
        lines.append(f"{name}: skipped: {why}")
    for name, found in summary["stamps"].items():
        lines += ["", f"{name}'s hand-offs, stamped (each segment: from the stamp before to this "
                  f"one; {found['skipped']} hand-offs lacked a stamp; CPU: the reactor thread's)",
                  "segment   | wall µs p50/p90/p99 | CPU µs p50/p90 | reached when"]  # fmt: skip
        described = dict(SEGMENTS)
        for label, spread in found["segments"].items():
            cpu = found["cpu"][label]
            walls = "/".join(f"{spread[k]:.0f}" for k in ("p50", "p90", "p99"))
            cpus = "-" if not cpu["n"] else "/".join(f"{cpu[k]:.0f}" for k in ("p50", "p90"))
            lines.append(f"{label:<9} | {walls:>19} | {cpus:>14} | {described[label]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's docstring); the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--targets", default="direct,crossbar,nginx",
                   help=f"comma-separated, of {', '.join(TARGETS)}")  # fmt: skip
    p.add_argument("--handoffs", type=int, default=2000, help="requests measured per target")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--gen-ms", type=float, default=10.0, help="the host's generation time")
    p.add_argument("--tokens", type=int, default=8, help="tokens (SSE events) per answer")
    p.add_argument("--stream", action="store_true", help="SSE answers instead of JSON bodies")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--warmup", type=int, default=100, help="requests per target not counted")
    p.add_argument("--crossbar-python", default=sys.executable,
                   help="the Python whose venv's twistd runs crossbar (default: this one)",
                   )  # fmt: skip
    p.add_argument("--crossbar-b-python", default="",
                   help="a second crossbar (another checkout's venv) as target crossbar-b, "
                   "taking turns with the others")  # fmt: skip
    p.add_argument("--stamps", action="store_true",
                   help="run crossbar under bench/proxy/crossbar_stamps.py and say where its share "
                   "of each hand-off goes")  # fmt: skip
    p.add_argument("--pin", action="store_true",
                   help="the host and the clients on CPU 0, the proxy on CPU 1")  # fmt: skip
    p.add_argument("--keep", action="store_true",
                   help="keep the logs, configs and stamps (their directory is named)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    args.targets = [t for t in args.targets.split(",") if t]
    unknown = set(args.targets) - set(TARGETS)
    if unknown or not args.targets:
        p.error(f"--targets: of {', '.join(TARGETS)}")
    if args.clients < 2:
        p.error("--clients: at least 2, so that a request waits whenever the slot frees")
    if "crossbar" in args.targets and not (Path(args.crossbar_python).parent / "twistd").exists():
        p.error(f"--crossbar-python: no twistd beside {args.crossbar_python}")
    if args.crossbar_b_python and "crossbar-b" not in args.targets:
        args.targets.insert(args.targets.index("crossbar") + 1 if "crossbar" in args.targets
                            else len(args.targets), "crossbar-b")  # fmt: skip
    if "crossbar-b" in args.targets and not (
        args.crossbar_b_python and (Path(args.crossbar_b_python).parent / "twistd").exists()
    ):
        p.error("crossbar-b: --crossbar-b-python must name a Python with twistd beside it")
    summaries: list[dict[str, Any]] = []

    def body(processes: Processes, work: Path) -> int:
        sitting = Sitting(args, processes, work)

        async def run(reactor: Any) -> None:
            summaries.append(await run_sitting(reactor, sitting))

        return react(run)

    status = with_processes("slot-handoff", body, keep=args.keep)
    if status == 0 and summaries:
        print(json.dumps(summaries[0], indent=2) if args.json else report(summaries[0]))
    return status


if __name__ == "__main__":
    sys.exit(main())
