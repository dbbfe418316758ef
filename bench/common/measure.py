"""What the benches measure with: a request body sent at once, a response read with the time of
its first byte, nearest-rank percentiles, a process's CPU seconds; and how a bench runs its
processes and its reactor."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

from twisted.internet import defer, task
from twisted.internet.interfaces import IConsumer
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import Agent, ResponseDone
from twisted.web.iweb import IBodyProducer
from zope.interface import implementer

from crossbar.demo.plan import DemoError
from crossbar.demo.processes import Process, Processes, command, wait_for_line

# The nginx proxy config the peer, proxy-rate and slot hand-off benches start nginx with.
NGINX_PROXY_CONF = Path(__file__).with_name("nginx-proxy.conf")
# Scripts a bench runs as processes of their own, by path.
PROXY_BENCHES = Path(__file__).resolve().parents[1] / "proxy"
CLK_TCK = os.sysconf("SC_CLK_TCK")


@implementer(IBodyProducer)
class BytesProducer:
    """A request body written in one go (FileBodyProducer goes through a cooperator)."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.length = len(body)

    def startProducing(self, consumer: IConsumer) -> defer.Deferred[None]:
        consumer.write(self.body)
        return defer.succeed(None)

    def pauseProducing(self) -> None:
        """Nothing to pause: the body is written at once."""

    resumeProducing = stopProducing = pauseProducing


class Reader(Protocol):
    """Reads a response body, noting the reactor time of its first byte and of every chunk
    (`times[i]` is when `chunks[i]` arrived: what a stream's events are timed by)."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.first: float | None = None
        self.chunks: list[bytes] = []
        self.times: list[float] = []
        self.done: defer.Deferred[bytes] = defer.Deferred()

    def dataReceived(self, data: bytes) -> None:
        now = self.clock.seconds()
        if self.first is None:
            self.first = now
        self.chunks.append(data)
        self.times.append(now)

    def connectionLost(self, reason: Failure) -> None:  # type: ignore[override]
        if reason.check(ResponseDone):
            self.done.callback(b"".join(self.chunks))
        else:
            self.done.errback(reason)


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank `q` percentile (0..100) of `values`; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil
    return ordered[int(rank) - 1]


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of `pid` (None: this process) so far."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def react(run: Callable[[Any], Coroutine[Any, Any, object]]) -> int:
    """Run `run(reactor)` in a reactor until it is done; its exit status (react always exits)."""
    try:
        task.react(lambda reactor: defer.ensureDeferred(run(reactor)))
    except SystemExit as e:
        return int(e.code or 0)
    return 0


async def wait_http(
    reactor: Any,
    process: Process,
    url: str,
    ready: Callable[[int, bytes], bool],
    seconds: float,
    what: str = "answer",
) -> None:
    """Poll GET `url` (5 times a second, without blocking the reactor) until
    `ready(status, body)`; DemoError, with the end of its log, if `process` exits first or
    `seconds` pass (`what` names what it did not do)."""
    agent = Agent(reactor)
    deadline = reactor.seconds() + seconds
    last = "no answer yet"
    while True:
        try:
            response = await agent.request(b"GET", url.encode()).addTimeout(5, reactor)
            reader = Reader(reactor)
            response.deliverBody(reader)
            body = await reader.done
            last = f"HTTP {response.code}: {body[:200].decode(errors='replace')}"
            if ready(response.code, body):
                return
        except Exception as e:  # refused while it starts
            last = f"{type(e).__name__}: {e}"
        if not process.running():
            raise DemoError(f"{process.name} exited at start; its log:\n{process.log_tail()}")
        if reactor.seconds() > deadline:
            raise DemoError(
                f"{process.name} did not {what} within {seconds:g}s (last GET {url}: {last}); "
                f"its log:\n{process.log_tail()}"
            )
        await task.deferLater(reactor, 0.2, lambda: None)


def with_processes(name: str, body: Callable[[Processes, Path], int], keep: bool = False) -> int:
    """Run `body` with the processes of a bench in a new temporary directory, then stop them;
    the directory goes if `body` returned 0 (unless `keep`), else it is kept and named (its
    logs). A process that did not start is said, with its log, as `name`'s error."""
    work = Path(tempfile.mkdtemp(prefix=f"crossbar-{name}-"))
    processes = Processes(work, record_pids=False)
    status = 1
    try:
        status = body(processes, work)
    except DemoError as e:
        print(f"{name}: {e}", file=sys.stderr)
    finally:
        for line in processes.stop():
            if "killed" in line:
                print(line, file=sys.stderr)
        if status == 0 and not keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"logs and configs kept in {work}", file=sys.stderr)
    return status


def start_fast_fake(
    processes: Processes, model: str, slots: int, reply_tokens: int = 16
) -> tuple[Process, str]:
    """A `crossbar-fakellama` that answers at once (`slots` slots, no token delay, short
    replies), so crossbar's own cost dominates: its process and its URL once it listens."""
    fake = processes.start(
        "fake",
        [
            command("crossbar-fakellama"),
            *("--port", "0", "--model", model, "--parallel", str(slots), "--ctx", "8192"),
            *("--tokens-per-second", "0", "--reply-tokens", str(reply_tokens)),
        ],
    )
    return fake, wait_for_line(fake, r" at (http://\S+)", time.monotonic() + 30.0)[1]


# --- CPU of a process tree, from /proc ---------------------------------------------------------


def stat_fields(line: str) -> list[str]:
    """A /proc/<pid>/stat line's fields after the command name (which may hold spaces and
    parentheses): [0] is the state (field 3 of proc(5)), [1] the ppid, [11..14] utime, stime,
    cutime, cstime in clock ticks."""
    return line.rsplit(")", 1)[1].split()


def stat_ticks(line: str) -> int:
    """CPU clock ticks of a process from its stat line: utime + stime (all its threads) plus
    cutime + cstime (its children that exited and were waited for)."""
    f = stat_fields(line)
    return int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])


def _stats() -> dict[int, str]:
    out = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = Path(entry.path, "stat").read_text()
            except OSError:
                pass  # gone meanwhile
    return out


def tree(root: int, stats: dict[int, str]) -> list[int]:
    """`root` and its descendants among `stats` (pid -> stat line)."""
    children: dict[int, list[int]] = {}
    for pid, line in stats.items():
        children.setdefault(int(stat_fields(line)[1]), []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            found.append(pid)
            todo.extend(children.get(pid, []))
    return found


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds so far of `root` and all its descendants."""
    stats = _stats()
    return sum(stat_ticks(stats[pid]) for pid in tree(root, stats)) / CLK_TCK


def crossbar_checkout(python: str) -> str:
    """Where `python` imports crossbar from (which checkout runs), or why it cannot."""
    code = "import crossbar, os; print(os.path.dirname(os.path.dirname(crossbar.__file__)))"
    try:
        # from / so that the current directory's checkout does not answer for it
        done = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=60, cwd="/"
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    return done.stdout.strip() if done.returncode == 0 else f"none ({done.stderr.strip()[-200:]})"


class PortPicker:
    """Ports from a bench's range, each checked free and never handed out twice in a sitting
    (a port a process just left may still be in TIME_WAIT)."""

    def __init__(self, ports: range) -> None:
        self._ports = ports
        self._next: Iterator[int] = iter(ports)

    def take(self, n: int = 1) -> list[int]:
        """`n` free ports; DemoError when the range runs out."""
        taken: list[int] = []
        for port in self._next:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            taken.append(port)
            if len(taken) == n:
                return taken
        first, last = self._ports.start, self._ports.stop - 1
        raise DemoError(f"fewer than {n} free ports left in {first}-{last}")
