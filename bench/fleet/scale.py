"""Benchmark scale-out: 1 and 2 crossbar instances on one `reuseport:` port, sharing an SQLite
file and then PostgreSQL.

    .venv/bin/python bench/fleet/scale.py [--duration 10] [--warmup 3] [--connections 64]
                                    [--pg postgresql://postgres@127.0.0.1:5432/test] [--json]

So that crossbar is what is measured, the upstream is nginx answering every request with one
fixed chat completion (Debian's nginx-light) and the load comes from wrk (Debian's wrk), each a
cheap C process. Each configuration starts its crossbars under twistd on one port (the kernel
spreads connections over them), lets wrk create the leases of 1,000 conversations during a
warm-up, then measures `--duration` seconds at `--connections` and at 1 connection. The same wrk
runs are made straight at nginx; "added" latency is crossbar's minus that. PostgreSQL runs in
a schema of its own, dropped afterwards. Prints req/s, p50/p99 latency, the ratio of 2
instances to 1 on the same store, and the CPU each crossbar used (% of one core).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

from bench.common.wrk_report import parse_wrk
from crossbar.demo.launch import free_ports

ROUTE, MODEL = "bench", "bench-model"
CONVERSATIONS = 1000
CLK_TCK = os.sysconf("SC_CLK_TCK")
TWISTD = str(Path(sys.executable).parent / "twistd")
ANSWER = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": MODEL,
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "ok"}}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13,
              "prompt_tokens_details": {"cached_tokens": 8}},
})  # fmt: skip

NGINX = """\
worker_processes 1;
daemon off;
user root root;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
  keepalive_requests 1000000;
  server {{
    listen 127.0.0.1:{port};
    default_type application/json;
    location = /health {{ return 200 '{{"status": "ok"}}'; }}
    location / {{ return 200 '{answer}'; }}
  }}
}}
"""

CONFIG = """\
[server]
listen = "reuseport:{port}:interface=127.0.0.1"
admin_listen = "tcp:{admin}:interface=127.0.0.1"
db = "{db}"
default_route = "{route}"
health_interval = "5s"
shutdown_grace = "1s"

[hosts.nginx]
url = "http://127.0.0.1:{upstream}"
parallel = 512
ctx = 1000000
models = ["{model}"]

[routes.{route}]
hosts = ["nginx"]
"""

WRK_SCRIPT = (
    """\
local n = 0
request = function()
  n = n + 1
  local body = '{"model": "MODEL", "max_tokens": 1, "messages": [{"role": "user", "content": ' ..
    '"Conversation ' .. (n % CONVERSATIONS) .. ': refactor the parser."}]}'
  return wrk.format("POST", "/r/ROUTE/v1/chat/completions",
    {["Content-Type"] = "application/json"}, body)
end
""".replace("MODEL", MODEL)
    .replace("CONVERSATIONS", str(CONVERSATIONS))
    .replace("ROUTE", ROUTE)
)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def wait_http(url: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: {url} never answered 200")
        time.sleep(0.1)


def wrk(url: str, script: Path, connections: int, seconds: float) -> dict[str, float]:
    """One wrk run: req/s and latency percentiles in ms."""
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", str(script),
         url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    report = parse_wrk(out)
    return {"rps": report["rps"], "p50_ms": report["p50_ms"], "p99_ms": report["p99_ms"],
            "errors": report["non2xx"]}  # fmt: skip


class Crossbars:
    """N crossbar processes under twistd on one reuseport port and one store."""

    def __init__(self, work: Path, n: int, db: str, upstream: int) -> None:
        self.port, *admins = free_ports(1 + n)
        self.admins = admins
        self.processes = []
        for i, admin in enumerate(admins):
            config = work / f"crossbar-{n}-{i}.toml"
            config.write_text(CONFIG.format(port=self.port, admin=admin, db=db, route=ROUTE,
                                            upstream=upstream, model=MODEL))  # fmt: skip
            log = (work / f"crossbar-{n}-{i}.log").open("w")  # the process's; closed at exit
            self.processes.append(subprocess.Popen(
                [TWISTD, "-n", "--pidfile=", "crossbar", "-c", str(config)],
                cwd=work, stdout=log, stderr=subprocess.STDOUT,
            ))  # fmt: skip
        for admin in admins:
            wait_http(f"http://127.0.0.1:{admin}/api/status")
        for admin in admins:  # every instance has seen the others (its slot share is set)
            deadline = time.monotonic() + 30
            while self.alive(admin) < n:
                if time.monotonic() > deadline:
                    raise SystemExit("bench: the instances never saw each other")
                time.sleep(0.2)

    def alive(self, admin: int) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/api/instances") as response:
            return sum(i["alive"] for i in json.loads(response.read())["instances"])

    def cpu(self) -> list[float]:
        return [cpu_seconds(p.pid) for p in self.processes]

    def stop(self) -> None:
        for p in self.processes:
            p.send_signal(signal.SIGTERM)
        for p in self.processes:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


def measure(url: str, script: Path, args: argparse.Namespace,
            crossbars: Crossbars | None = None) -> dict[str, Any]:  # fmt: skip
    wrk(url, script, args.connections, args.warmup)  # leases made, connections warm
    before = crossbars.cpu() if crossbars else []
    started = time.monotonic()
    loaded = wrk(url, script, args.connections, args.duration)
    elapsed = time.monotonic() - started
    cpu = [round(100 * (b - a) / elapsed) for a, b in zip(before, crossbars.cpu(), strict=True)] \
        if crossbars else []  # fmt: skip
    single = wrk(url, script, 1, max(3.0, args.duration / 2))
    return {"loaded": loaded, "single": single, "cpu_percent": cpu}


def pg_schema_url(base: str) -> tuple[str, str]:
    import psycopg

    name = f"cb_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    joiner = "&" if "?" in base else "?"
    return name, f"{base}{joiner}options={quote(f'-csearch_path={name}')}"


def drop_schema(base: str, name: str) -> None:
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {name} CASCADE")


def run(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    (upstream,) = free_ports(1)
    (work / "nginx.conf").write_text(NGINX.format(tmp=work, port=upstream, answer=ANSWER))
    nginx = subprocess.Popen(["nginx", "-c", str(work / "nginx.conf"), "-p", str(work)])
    script = work / "chat.lua"
    script.write_text(WRK_SCRIPT)
    rows = []
    try:
        wait_http(f"http://127.0.0.1:{upstream}/health")
        direct = measure(f"http://127.0.0.1:{upstream}", script, args)
        rows.append({"config": "nginx direct", "instances": 0, **direct})
        for store in ("sqlite", "postgres"):
            for n in (1, 2):
                schema = None
                if store == "sqlite":
                    db = str(work / f"shared-{n}.db")
                else:
                    schema, db = pg_schema_url(args.pg)
                crossbars = Crossbars(work, n, db, upstream)
                try:
                    result = measure(f"http://127.0.0.1:{crossbars.port}", script, args, crossbars)
                finally:
                    crossbars.stop()
                    if schema:
                        drop_schema(args.pg, schema)
                rows.append({"config": f"{n} x crossbar, {store}", "instances": n, **result})
                print(f"  {rows[-1]['config']}: {result['loaded']['rps']:.0f} req/s",
                      file=sys.stderr)  # fmt: skip
    finally:
        nginx.send_signal(signal.SIGQUIT)
        nginx.wait(10)
    return rows


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    direct = rows[0]
    base = {r["config"].split(", ")[1]: r["loaded"]["rps"] for r in rows if r["instances"] == 1}
    print(f"c{args.connections} for {args.duration:g} s, then c1; added = crossbar - nginx direct")
    print("| config | req/s | x 1 instance | p50 ms | p99 ms | c1 added p50 ms | c1 added p99 ms"
          " | crossbar cpu % | non-2xx |")  # fmt: skip
    print("|---|--:|--:|--:|--:|--:|--:|---|--:|")
    for r in rows:
        loaded, single = r["loaded"], r["single"]
        store = r["config"].split(", ")[1] if r["instances"] else None
        ratio = f"{loaded['rps'] / base[store]:.2f}" if store else "-"
        added50 = single["p50_ms"] - direct["single"]["p50_ms"] if store else 0.0
        added99 = single["p99_ms"] - direct["single"]["p99_ms"] if store else 0.0
        cpu = ", ".join(str(c) for c in r["cpu_percent"]) or "-"
        print(f"| {r['config']} | {loaded['rps']:.0f} | {ratio} | {loaded['p50_ms']:.2f} | "
              f"{loaded['p99_ms']:.2f} | {added50:.2f} | {added99:.2f} | {cpu} | "
              f"{loaded['errors'] + single['errors']} |")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--pg", default=os.environ.get(
        "CROSSBAR_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"))  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON")
    args = parser.parse_args(argv)
    missing = [tool for tool in ("nginx", "wrk") if shutil.which(tool) is None]
    if missing:
        print(f"bench: needs {' and '.join(missing)} (apt-get install nginx-light wrk)",
              file=sys.stderr)  # fmt: skip
        return 2
    with tempfile.TemporaryDirectory(prefix="crossbar-scale-") as tmp:
        try:
            rows = run(args, Path(tmp))
        except SystemExit:
            for log in sorted(Path(tmp).glob("*.log")):
                print(f"--- {log.name}\n{log.read_text()[-2000:]}", file=sys.stderr)
            raise
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        report(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
