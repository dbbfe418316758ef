"""The stage of bench/peers/peers.py: one fixed-answer upstream (nginx answering every chat
completion with one answer, and the paths the peer routers probe before they accept a worker)
and each router started in front of it (nginx, crossbar under twistd, smg and vllm-router from their
venvs), ready for work, and stopped after.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.common.measure import NGINX_PROXY_CONF, PortPicker
from bench.fleet.scale import ANSWER, MODEL
from bench.peers import peer_routers
from crossbar.demo.processes import Process, Processes, stop

HERE = Path(__file__).parent
PORTS = range(24000, 25000)  # this bench's share of the machine's ports
READY_SECONDS = 60.0
PEER_OF = {  # router -> (peer, policy)
    "smg": ("smg", "cache_aware"),
    "vllm-router": ("vllm-router", "cache_aware"),
    "vllm-router-hash": ("vllm-router", "consistent_hash"),
}
UPSTREAM = """\
worker_processes 1;
master_process off;
daemon off;
user root root;
pid {tmp}/upstream.pid;
error_log {tmp}/upstream-error.log;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/upstream-body;
  proxy_temp_path {tmp}/upstream-proxy;
  fastcgi_temp_path {tmp}/upstream-fastcgi;
  uwsgi_temp_path {tmp}/upstream-uwsgi;
  scgi_temp_path {tmp}/upstream-scgi;
  keepalive_requests 1000000;
  keepalive_timeout 600s;
  client_max_body_size 64m;
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    default_type application/json;
    location = /health {{ return 200 '{{"status": "ok"}}'; }}
    location = /v1/models {{ return 200 '{models}'; }}
    location = /models {{ return 200 '{models}'; }}
    location = /tokenize {{ return 200 '{{"tokens": [1, 2, 3, 4, 5, 6, 7, 8]}}'; }}
    location = /v1/chat/completions {{ return 200 '{answer}'; }}
    location / {{ return 404 '{not_found}'; }}
  }}
}}
"""
MODELS = json.dumps(
    {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "llamacpp"}]}
)
NOT_FOUND = json.dumps({"error": {"code": 404, "message": "File Not Found"}})

CROSSBAR = """\
[server]
listen = "tcp:{port}:interface=127.0.0.1"
admin_listen = "tcp:{admin}:interface=127.0.0.1"
db = "{db}"
default_route = "bench"
health_interval = "5s"
shutdown_grace = "1s"

[hosts.upstream]
url = "http://127.0.0.1:{upstream}"
parallel = {parallel}
ctx = 1000000
models = ["{model}"]

[routes.bench]
hosts = ["upstream"]
"""


class RouterFailed(Exception):
    """A router that did not start, answer or serve; the message says why."""


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_until(process: Process, url: str, ready: Callable[[int, bytes], bool], what: str,
               seconds: float = READY_SECONDS) -> None:  # fmt: skip
    """Poll GET `url` until `ready(status, body)`; RouterFailed, with the end of the process's
    log, if it exits first or `seconds` pass."""
    deadline = time.monotonic() + seconds
    last = "no answer yet"
    while True:
        try:
            status, body = get(url)
            last = f"HTTP {status}: {body[:200].decode(errors='replace')}"
            if ready(status, body):
                return
        except (OSError, ValueError) as e:
            last = f"{type(e).__name__}: {e}"
        if not process.running():
            raise RouterFailed(f"{process.name} exited at start; its log:\n{process.log_tail()}")
        if time.monotonic() > deadline:
            raise RouterFailed(f"{process.name} did not {what} within {seconds:g}s (last GET "
                               f"{url}: {last}); its log:\n{process.log_tail()}")  # fmt: skip
        time.sleep(0.1)


def ok(status: int, _body: bytes) -> bool:
    return status == 200


def stop_one(processes: Processes, process: Process) -> None:
    """Stop one of `processes` now (the rest are stopped at the end)."""
    for line in stop([process]):
        if "killed" in line:
            print(line, file=sys.stderr)
    processes.started.remove(process)


@dataclass
class Sitting:
    args: argparse.Namespace
    processes: Processes
    work: Path
    ports: PortPicker = field(default_factory=lambda: PortPicker(PORTS))
    skipped: dict[str, str] = field(default_factory=dict)
    starts: int = 0

    def label(self, name: str) -> str:
        self.starts += 1
        return f"{self.starts:02d}-{name}"


@dataclass
class Router:
    """A started router: its process (None: direct), its URL, and how it knows a lease per
    conversation is made (crossbar's admin API)."""

    process: Process | None
    url: str
    leases: Callable[[], int] | None = None


def start_nginx(sitting: Sitting, name: str, text: str, port: int) -> Process:
    label = sitting.label(name)
    conf = sitting.work / f"{label}.conf"
    conf.write_text(text)
    process = sitting.processes.start(label, ["nginx", "-c", str(conf), "-p", str(sitting.work)])
    wait_until(process, f"http://127.0.0.1:{port}/health", ok, "answer /health")
    return process


def start_upstream(sitting: Sitting) -> int:
    (port,) = sitting.ports.take()
    text = UPSTREAM.format(tmp=sitting.work, port=port, answer=ANSWER, models=MODELS,
                           not_found=NOT_FOUND)  # fmt: skip
    start_nginx(sitting, "upstream", text, port)
    return port


def nginx_proxy_conf(sitting: Sitting, port: int, upstream: int, streaming: bool) -> str:
    text = NGINX_PROXY_CONF.read_text()
    text = text.replace("{tmp}", str(sitting.work)).replace("{port}", str(port))
    text = text.replace("{upstream}", str(upstream))
    text = text.replace("nginx-proxy.pid", f"nginx-proxy-{port}.pid")
    if streaming:  # as an operator puts it in front of SSE: each chunk passed on at once
        text = text.replace("proxy_http_version 1.1;", "proxy_http_version 1.1;\n"
                            "      proxy_buffering off;")  # fmt: skip
    return text


def start_router(sitting: Sitting, name: str, upstream: int, streaming: bool = False) -> Router:
    """Router `name` in front of the upstream on port `upstream`, ready for work."""
    if name == "direct":
        return Router(None, f"http://127.0.0.1:{upstream}")
    if name == "nginx":
        (port,) = sitting.ports.take()
        text = nginx_proxy_conf(sitting, port, upstream, streaming)
        return Router(start_nginx(sitting, "nginx", text, port), f"http://127.0.0.1:{port}")
    if name == "crossbar":
        return start_crossbar(sitting, upstream)
    peer, policy = PEER_OF[name]
    port, prometheus = sitting.ports.take(2)
    script = peer_routers.ensure_installed(peer)
    argv = peer_routers.command(
        peer, script, port, [f"http://127.0.0.1:{upstream}"], policy, prometheus
    )
    process = sitting.processes.start(sitting.label(name), argv)

    def all_healthy(status: int, body: bytes) -> bool:
        state = json.loads(body) if status == 200 else {}
        return state.get("healthy_workers") == state.get("total_workers") == 1

    url = f"http://127.0.0.1:{port}"
    wait_until(process, f"{url}/readiness", all_healthy, "accept the worker")
    return Router(process, url)


def start_crossbar(sitting: Sitting, upstream: int) -> Router:
    port, admin = sitting.ports.take(2)
    label = sitting.label("crossbar")
    config = sitting.work / f"{label}.toml"
    slots = max(512, 2 * sitting.args.streams)  # it never queues
    config.write_text(CROSSBAR.format(port=port, admin=admin, db=sitting.work / f"{label}.db",
                                      upstream=upstream, parallel=slots, model=MODEL))  # fmt: skip
    twistd = str(Path(sitting.args.crossbar_python).parent / "twistd")
    process = sitting.processes.start(label, [twistd, "-n", "--pidfile=", "crossbar", "-c",
                                              str(config)])  # fmt: skip

    def healthy(status: int, body: bytes) -> bool:
        hosts = json.loads(body)["hosts"] if status == 200 else []
        return len(hosts) == 1 and bool(hosts[0].get("healthy"))

    base = f"http://127.0.0.1:{admin}"
    wait_until(process, f"{base}/api/hosts", healthy, "find its host healthy")

    def leases() -> int:
        return int(json.loads(get(f"{base}/api/leases?limit=1")[1])["total"])

    return Router(process, f"http://127.0.0.1:{port}", leases)
