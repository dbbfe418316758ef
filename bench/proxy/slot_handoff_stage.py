"""The stage of bench/proxy/slot_handoff.py: the one-slot host (bench/proxy/slot_host.py),
crossbar under twistd or nginx in front of it, each started and ready; the host's records of
each request; and the proxy process's preemptions and CPU pinning."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httptools
from twisted.internet import defer
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure

from bench.common.measure import NGINX_PROXY_CONF, PortPicker, wait_http
from crossbar.demo.processes import Process, Processes

HERE = Path(__file__).resolve().parent
PORTS = range(24500, 25000)  # this bench's share of the machine's ports
START_SECONDS = 60.0
MODEL = "tiny"
ROUTE = "bench"
PATH = "/v1/chat/completions"

CROSSBAR_CONFIG = """\
[server]
listen = "tcp:{listen}:interface=127.0.0.1"
admin_listen = "tcp:{admin}:interface=127.0.0.1"
db = "{db}"
default_route = "{route}"
health_interval = "1h"
shutdown_grace = "1s"

[hosts.tiny]
url = "http://127.0.0.1:{host}"
parallel = 1
models = ["{model}"]

[routes.{route}]
hosts = ["tiny"]
"""


def preemptions(pid: int) -> int:
    """How often `pid`'s main thread (crossbar's reactor) was switched out while it could run
    (`nonvoluntary_ctxt_switches` in /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("nonvoluntary_ctxt_switches:"):
            return int(line.split()[1])
    return 0


def pin(pid: int, cpu: int) -> None:
    """Keep `pid` (all its threads) on CPU `cpu`."""
    for task in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(task), {cpu})


@dataclass
class Target:
    """Where the clients go: a port, and the process whose CPU is the proxy's (None: the host
    itself); `queues_in_front`: the target holds waiting requests back from the host."""

    name: str
    port: int
    process: Process | None
    queues_in_front: bool


@dataclass
class Sitting:
    """What the sitting's steps share: the command line, the processes, the log directory,
    the ports, and the targets skipped with why."""

    args: argparse.Namespace
    processes: Processes
    work: Path
    ports: PortPicker = field(default_factory=lambda: PortPicker(PORTS))
    skipped: dict[str, str] = field(default_factory=dict)


def _ok(status: int, _body: bytes) -> bool:
    return status == 200


async def start_host(reactor: Any, sitting: Sitting) -> int:
    """bench/proxy/slot_host.py on a port of its own, once it answers /health; its port."""
    (port,) = sitting.ports.take()
    args = sitting.args
    argv = [sys.executable, str(HERE / "slot_host.py"), "--port", str(port)]
    argv += ["--gen-ms", str(args.gen_ms), "--tokens", str(args.tokens)]
    process = sitting.processes.start("host", argv)
    await wait_http(reactor, process, f"http://127.0.0.1:{port}/health", _ok, START_SECONDS)
    return port


def host_process(sitting: Sitting) -> Process:
    """The host's process."""
    return next(p for p in sitting.processes.started if p.name == "host")


def crossbar_python(args: argparse.Namespace, name: str) -> str:
    """The Python whose venv runs target `name` (`crossbar` or `crossbar-b`)."""
    return str(args.crossbar_python if name == "crossbar" else args.crossbar_b_python)


async def start_crossbar(reactor: Any, sitting: Sitting, host: int, name: str) -> Target:
    """crossbar (target `name`) under twistd in front of the host, once it finds the host
    healthy: `parallel = 1`, one route, a temporary SQLite file; under
    bench/proxy/crossbar_stamps.py with `--stamps`."""
    listen, admin = sitting.ports.take(2)
    config = sitting.work / f"{name}.toml"
    config.write_text(
        CROSSBAR_CONFIG.format(
            listen=listen, admin=admin, db=sitting.work / f"{name}.db", route=ROUTE, host=host,
            model=MODEL,
        )
    )  # fmt: skip
    python = crossbar_python(sitting.args, name)
    argv = [str(Path(python).parent / "twistd")]
    if sitting.args.stamps:
        argv = [python, str(HERE / "crossbar_stamps.py"), str(sitting.work / f"{name}-stamps.json")]
    argv += ["-n", "--pidfile=", "crossbar", "-c", str(config)]
    process = sitting.processes.start(name, argv)

    def healthy(status: int, body: bytes) -> bool:
        hosts = json.loads(body)["hosts"] if status == 200 else []
        return len(hosts) == 1 and bool(hosts[0].get("healthy"))

    url = f"http://127.0.0.1:{admin}/api/hosts"
    await wait_http(reactor, process, url, healthy, START_SECONDS, "find its host healthy")
    return Target(name, listen, process, queues_in_front=True)


async def start_nginx(reactor: Any, sitting: Sitting, host: int) -> Target:
    """nginx as a plain proxy in front of the host (bench/common/nginx-proxy.conf: kept connections
    both ways; with `--stream`, `proxy_buffering off`), once it passes /health on."""
    (port,) = sitting.ports.take()
    text = NGINX_PROXY_CONF.read_text()
    text = text.replace("{tmp}", str(sitting.work)).replace("{port}", str(port))
    text = text.replace("{upstream}", str(host))
    if sitting.args.stream:  # as an operator puts it in front of SSE: each chunk passed on
        text = text.replace("proxy_http_version 1.1;", "proxy_http_version 1.1;\n"
                            "      proxy_buffering off;")  # fmt: skip
    conf = sitting.work / "nginx.conf"
    conf.write_text(text)
    process = sitting.processes.start("nginx", ["nginx", "-c", str(conf), "-p", str(sitting.work)])
    await wait_http(reactor, process, f"http://127.0.0.1:{port}/health", _ok, START_SECONDS)
    return Target("nginx", port, process, queues_in_front=False)


async def host_records(reactor: Any, host: int) -> tuple[list[dict[str, Any]], int]:
    """The host's records since the last call (then forgotten there), and its accepted count."""
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", host)
    reader = _Fetch()
    await connectProtocol(endpoint, reader)
    state = json.loads(await reader.body.addTimeout(30, reactor))
    return state["records"], state["accepted"]


class _Fetch(Protocol):
    """GET /_bench/records on a connection of its own, its body read whole."""

    def __init__(self) -> None:
        self.body: defer.Deferred[bytes] = defer.Deferred()
        self._parts: list[bytes] = []
        self._parser = httptools.HttpResponseParser(self)

    def connectionMade(self) -> None:
        request = b"GET /_bench/records HTTP/1.1\r\nHost: host\r\nConnection: close\r\n\r\n"
        self.transport.write(request)

    def dataReceived(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self._parts.append(body)

    def on_message_complete(self) -> None:
        if not self.body.called:
            self.body.callback(b"".join(self._parts))

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if not self.body.called:
            self.body.errback(reason)
