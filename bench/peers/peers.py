"""crossbar beside nginx, smg and vllm-router in front of one fixed-answer upstream: the latency
each adds, the rate each serves, the CPU each spends per request and per relayed stream chunk.

    .venv/bin/python bench/peers/peers.py [--duration 10] [--warmup 3] [--runs 3]
        [--routers direct,nginx,crossbar,smg,vllm-router,vllm-router-hash]
        [--bodies small,100k] [--streams 1000] [--stream-rate 10]
        [--crossbar-python .venv/bin/python] [--json]

One sitting, one upstream: nginx answering every chat completion with one fixed answer (usage
included) and the paths the peer routers probe before they accept a worker (`/health`,
`/v1/models` listing the model, `/tokenize`; every other path 404, as llama-server would). The
routers, each started alone in front of it and stopped after:

- `direct`: no router, wrk straight at the upstream (the baseline of "added");
- `nginx`: nginx as the proxy (bench/common/nginx-proxy.conf, keep-alive to the upstream);
- `crossbar`: twistd from `--crossbar-python`'s venv, one route over one host with 512 slots
  (it never queues), a lease per conversation and a usage row per request in an SQLite file in
  the sitting's temporary directory, as in production;
- `smg` (1.13.0, `--policy cache_aware`), `vllm-router` (0.1.17, `cache_aware`) and
  `vllm-router-hash` (0.1.17, `consistent_hash`, with an `X-Session-ID` per conversation), each
  from its own venv (bench/peers/peer_routers.py); one that is not installed is skipped, saying why.

For each router and body (`small`: one short user turn; `100k`: a ~100 KB agent conversation,
a long system prompt, tool definitions, tool calls and their results, built once and
deterministically), wrk posts the body of 1,000 (small) or 200 (100k) conversations in turn,
each with its own first user message, so crossbar keeps a lease per conversation as it does for
real clients. A warm-up at 32 connections lasts `--warmup` seconds and until every conversation
was sent (for crossbar: until its admin API lists each one's lease); then `--duration` seconds
at 32 connections (req/s, and the router's CPU: utime + stime of its process tree from
/proc/<pid>/stat over that window, divided by the requests) and max(3, duration/2) seconds at 1
connection (p50 and p99 from wrk's latency distribution; "added" is the router's minus direct's).

Then the streams: `--streams` concurrent SSE streams from bench/proxy/sse_source.py (`--stream-rate`
chunks a second each), read by an asyncio client in this process through each router (direct
first, for the source's own gaps), ramped over a second, measured for `--duration` seconds
after a 2-second warm-up: chunks relayed, the router's CPU µs per chunk, the p99 gap between
chunks (`--streams 0` skips them). nginx relays them with `proxy_buffering off`, as one puts
it in front of SSE.

Printed: the load average before the sitting (a warning above 1), which checkout crossbar ran
from, one table (router | body | added p50 c=1 | added p99 c=1 | req/s c=32 | CPU µs/request |
notes) and one for the streams; with `--runs R`, each figure is the median of R runs. A router
that fails says so in its row (notes) and the others go on; every process is stopped at the
end, and the logs are kept (their directory is named) when something failed. Ports come from
24000-24999; a default sitting takes about 16 minutes on 2 cores. Needs nginx and wrk on PATH
(Debian: apt-get install nginx-light wrk).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common.measure import (
    PROXY_BENCHES,
    crossbar_checkout,
    tree_cpu_seconds,
    with_processes,
)
from bench.common.wrk_report import parse_wrk
from bench.peers import peer_routers
from bench.peers.agent_bodies import body_parts
from bench.peers.peers_setup import (
    PEER_OF,
    Router,
    RouterFailed,
    Sitting,
    ok,
    start_router,
    start_upstream,
    stop_one,
    wait_until,
)
from bench.proxy.streams import Reader
from crossbar.demo.processes import Processes

HERE = Path(__file__).parent
ROUTERS = ("direct", "nginx", "crossbar", "smg", "vllm-router", "vllm-router-hash")
BODIES = ("small", "100k")
CONVERSATIONS = {"small": 1000, "100k": 200}
PATH = "/v1/chat/completions"  # crossbar's default route takes it as the peers do
WARM_SECONDS = 120.0  # the longest a warm-up may go on making leases
STREAM_WARMUP = 2.0

WRK_SCRIPT = """\
local function slurp(path)
  local f = assert(io.open(path, "rb"))
  local text = f:read("*a")
  f:close()
  return text
end
local prefix, suffix = slurp("{prefix}"), slurp("{suffix}")
local session = "{session}"
local headers = {{["Content-Type"] = "application/json"}}
local n = 0
request = function()
  n = n % {conversations} + 1
  if session ~= "" then headers[session] = "conversation-" .. n end
  return wrk.format("POST", "{path}", headers, prefix .. n .. suffix)
end
"""


# --- wrk ---------------------------------------------------------------------------------------


def wrk(url: str, script: Path, connections: int, seconds: float) -> dict[str, Any]:
    """One wrk run (one thread); RouterFailed if wrk fails or nothing was answered 2xx."""
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "--timeout", "10s",
            "-s", str(script), url]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    if done.returncode != 0:
        raise RouterFailed(f"wrk exited {done.returncode}: {done.stderr.strip()[-300:]}")
    result = parse_wrk(done.stdout)
    if result["requests"] == 0 or result["non2xx"] >= result["requests"]:
        raise RouterFailed(f"no 2xx answer in {seconds:g}s at c={connections}")
    return result


# --- one router, one body ---------------------------------------------------------------------


def write_script(sitting: Sitting, kind: str, session_header: bool) -> Path:
    before, after = body_parts(kind)
    prefix, suffix = sitting.work / f"body-{kind}.before", sitting.work / f"body-{kind}.after"
    prefix.write_bytes(before)
    suffix.write_bytes(after)
    script = sitting.work / f"wrk-{kind}{'-session' if session_header else ''}.lua"
    session = "X-Session-ID" if session_header else ""
    script.write_text(WRK_SCRIPT.format(prefix=prefix, suffix=suffix, path=PATH, session=session,
                                        conversations=CONVERSATIONS[kind]))  # fmt: skip
    return script


def measure(router: Router, script: Path, args: argparse.Namespace, kind: str,
            leases: int) -> dict[str, Any]:  # fmt: skip
    """Warm (every conversation of `kind` sent; crossbar: `leases` made), then c=32 with the
    router's CPU, then c=1."""
    conversations = CONVERSATIONS[kind]
    sent = wrk(router.url, script, 32, args.warmup)["requests"]
    deadline = time.monotonic() + WARM_SECONDS
    while sent < conversations or (router.leases and router.leases() < leases):
        if time.monotonic() > deadline:
            made = router.leases() if router.leases else "?"
            raise RouterFailed(f"warm-up: {made} of {leases} leases after {WARM_SECONDS:g}s")
        sent += wrk(router.url, script, 32, args.warmup)["requests"]
    pid = router.process.pid if router.process else None
    cpu0 = tree_cpu_seconds(pid) if pid else 0.0
    loaded = wrk(router.url, script, 32, args.duration)
    cpu1 = tree_cpu_seconds(pid) if pid else 0.0
    single = wrk(router.url, script, 1, max(3.0, args.duration / 2))
    cpu2 = tree_cpu_seconds(pid) if pid else 0.0
    return {
        "loaded": loaded,
        "single": single,
        "warmup_requests": sent,
        "cpu_us_per_request": 1e6 * (cpu1 - cpu0) / loaded["requests"] if pid else None,
        "c1_cpu_us_per_request": 1e6 * (cpu2 - cpu1) / single["requests"] if pid else None,
    }


def run_router(sitting: Sitting, name: str, upstream: int) -> dict[str, dict[str, Any]]:
    """Every body through router `name`; a failure is the row of each body not measured."""
    out: dict[str, dict[str, Any]] = {}
    router = None
    try:
        router = start_router(sitting, name, upstream)
        leases = 0
        for kind in sitting.args.bodies:
            leases += CONVERSATIONS[kind]
            script = write_script(sitting, kind, session_header=name == "vllm-router-hash")
            try:
                out[kind] = measure(router, script, sitting.args, kind, leases)
            except Exception as e:  # its row says so; the others go on
                out[kind] = {"error": _first_line(e)}
                _log_failure(name, kind, e)
                if router.process and not router.process.running():
                    raise
    except Exception as e:  # its rows say so; the other routers go on
        for kind in sitting.args.bodies:
            out.setdefault(kind, {"error": _first_line(e)})
        _log_failure(name, "start", e)
    finally:
        if router and router.process:
            stop_one(sitting.processes, router.process)
    return out


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:160]


def _log_failure(name: str, what: str, e: BaseException) -> None:
    print(f"  {name} ({what}) failed: {e}", file=sys.stderr, flush=True)


# --- streams ----------------------------------------------------------------------------------


async def stream_window(port: int, n: int, seconds: float, pid: int | None) -> dict[str, Any]:
    """n streams through the router on `port`, ramped over a second; the measured window's
    chunks, gaps and the router's CPU."""
    loop = asyncio.get_running_loop()
    reader = Reader()
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(reader.stream(port, PATH, i)))
        await asyncio.sleep(1.0 / n)
    t0 = loop.time()
    reader.window = (t0 + STREAM_WARMUP, t0 + STREAM_WARMUP + seconds)
    await asyncio.sleep(max(0.0, reader.window[0] - loop.time()))
    cpu0 = tree_cpu_seconds(pid) if pid else 0.0
    await asyncio.sleep(max(0.0, reader.window[1] - loop.time()))
    cpu1 = tree_cpu_seconds(pid) if pid else 0.0
    _, pending = await asyncio.wait(tasks, timeout=30)
    for task in pending:  # a stream the router stalled
        task.cancel()
    failed = sum(1 for t in tasks if t.done() and not t.cancelled() and t.exception())
    gaps = sorted(reader.gaps) or [0.0]
    return {
        "streams": n,
        "chunks": reader.chunks,
        "errors": reader.errors + failed + len(pending),
        "statuses": sorted(reader.statuses),
        "gap_p50_ms": 1000 * gaps[len(gaps) // 2],
        "gap_p99_ms": 1000 * gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))],
        "cpu_percent": 100 * (cpu1 - cpu0) / seconds if pid else None,
        "us_per_chunk": 1e6 * (cpu1 - cpu0) / max(reader.chunks, 1) if pid else None,
    }


def run_streams(sitting: Sitting, routers: list[str]) -> dict[str, dict[str, Any]]:
    """The streams through each of `routers`, one SSE source for all."""
    args = sitting.args
    (source_port,) = sitting.ports.take()
    per_router = STREAM_WARMUP + args.duration + 40  # the ramp and a slow machine's delays
    tokens = int(args.stream_rate * per_router)
    argv = [sys.executable, str(PROXY_BENCHES / "sse_source.py"), str(source_port), "--rate",
            str(args.stream_rate), "--tokens", str(tokens)]  # fmt: skip
    source = sitting.processes.start(sitting.label("sse-source"), argv)
    out: dict[str, dict[str, Any]] = {}
    try:
        wait_until(source, f"http://127.0.0.1:{source_port}/health", ok, "answer /health")
        for name in routers:
            router = None
            try:
                router = start_router(sitting, name, source_port, streaming=True)
                port = int(router.url.rsplit(":", 1)[1])
                pid = router.process.pid if router.process else None
                out[name] = asyncio.run(stream_window(port, args.streams, args.duration, pid))
                if out[name]["chunks"] == 0:
                    out[name]["error"] = f"no chunk relayed ({', '.join(out[name]['statuses'])})"
            except Exception as e:  # its row says so; the others go on
                out[name] = {"error": _first_line(e)}
                _log_failure(name, "streams", e)
            finally:
                if router and router.process:
                    stop_one(sitting.processes, router.process)
    except Exception as e:
        for name in routers:
            out.setdefault(name, {"error": f"SSE source: {_first_line(e)}"})
    finally:
        stop_one(sitting.processes, source)
    return out


# --- the sitting ------------------------------------------------------------------------------


def one_run(sitting: Sitting, routers: list[str]) -> dict[str, Any]:
    upstream_port = start_upstream(sitting)
    upstream = sitting.processes.started[-1]
    rows = {}
    try:
        for name in routers:
            began = time.monotonic()
            rows[name] = run_router(sitting, name, upstream_port)
            shown = ", ".join(
                f"{kind} {r['loaded']['rps']:.0f} req/s" if "loaded" in r else f"{kind} failed"
                for kind, r in rows[name].items()
            )
            print(f"  {name}: {shown} ({time.monotonic() - began:.0f} s)", file=sys.stderr,
                  flush=True)  # fmt: skip
    finally:
        stop_one(sitting.processes, upstream)
    streams = {}
    if sitting.args.streams > 0:
        streams = run_streams(sitting, routers)
        for name, r in streams.items():
            shown = r.get("error") or f"{r['chunks']} chunks"
            print(f"  streams, {name}: {shown}", file=sys.stderr, flush=True)
    return {"rows": rows, "streams": streams}


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(runs: list[dict[str, Any]], routers: list[str], bodies: list[str]) -> dict:
    """The median over runs of each router's figures, per body, and of its streams."""
    table = []
    for name in routers:
        for kind in bodies:
            results = [run["rows"][name][kind] for run in runs]
            good = [r for r in results if "loaded" in r]
            direct = [run["rows"]["direct"][kind] for run in runs]
            added50, added99 = [], []
            for r, d in zip(results, direct, strict=True):
                if "loaded" in r and "single" in d:
                    added50.append(r["single"]["p50_ms"] - d["single"]["p50_ms"])
                    added99.append(r["single"]["p99_ms"] - d["single"]["p99_ms"])
            errors = sum(w["non2xx"] + w["socket_errors"] for r in good
                         for w in (r["loaded"], r["single"]))  # fmt: skip
            table.append({
                "router": name, "body": kind, "runs": len(good),
                "added_p50_ms": _median(added50), "added_p99_ms": _median(added99),
                "p50_ms": _median([r["single"]["p50_ms"] for r in good]),
                "p99_ms": _median([r["single"]["p99_ms"] for r in good]),
                "rps": _median([r["loaded"]["rps"] for r in good]),
                "cpu_us_per_request": _median([r["cpu_us_per_request"] for r in good]),
                "c1_cpu_us_per_request": _median([r["c1_cpu_us_per_request"] for r in good]),
                "errors": errors,
                "failures": [r["error"] for r in results if "error" in r],
            })  # fmt: skip
    streams = []
    for name in routers:
        results = [run["streams"][name] for run in runs if name in run["streams"]]
        if not results:
            continue
        good = [r for r in results if "error" not in r]
        streams.append({
            "router": name, "runs": len(good),
            "chunks": _median([r["chunks"] for r in good]),
            "us_per_chunk": _median([r["us_per_chunk"] for r in good]),
            "cpu_percent": _median([r["cpu_percent"] for r in good]),
            "gap_p99_ms": _median([r["gap_p99_ms"] for r in good]),
            "errors": sum(r["errors"] for r in good),
            "failures": [r["error"] for r in results if "error" in r],
        })  # fmt: skip
    return {"table": table, "streams": streams}


def label(name: str) -> str:
    if name in PEER_OF:
        peer, policy = PEER_OF[name]
        version = peer_routers.PEERS[peer].requirement.split("==")[1]
        return f"{peer} {version} {policy}"
    return {"nginx": "nginx (proxy)"}.get(name, name)


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ms_or_dash(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} ms"


def report(summary: dict, args: argparse.Namespace, skipped: dict[str, str]) -> None:
    runs = f", median of {args.runs} runs" if args.runs > 1 else ""
    print(f"\nwrk -t1, {args.duration:g} s at c=32, {max(3.0, args.duration / 2):g} s at c=1"
          f"{runs}; added = the router's latency minus direct's, same body")  # fmt: skip
    print("| router | body | added p50 c=1 | added p99 c=1 | req/s c=32 | CPU µs/request | notes |")
    print("|---|---|--:|--:|--:|--:|---|")
    for r in summary["table"]:
        notes = []
        if r["router"] == "direct" and r["p50_ms"] is not None:
            notes.append(f"p50 {r['p50_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms")
        if r["errors"]:
            notes.append(f"{r['errors']} errors (non-2xx or socket)")
        notes += [f"failed: {f}" for f in r["failures"]]
        added = [_ms_or_dash(r[k] if r["router"] != "direct" else None)
                 for k in ("added_p50_ms", "added_p99_ms")]  # fmt: skip
        print(f"| {label(r['router'])} | {r['body']} | {added[0]} | {added[1]} "
              f"| {_f(r['rps'], ',.0f')} | {_f(r['cpu_us_per_request'], ',.0f')} "
              f"| {'; '.join(notes)} |")  # fmt: skip
    if summary["streams"]:
        print(f"\nstreams: {args.streams} at once, {args.stream_rate:g} chunks/s each, "
              f"{args.duration:g} s measured{runs}")  # fmt: skip
        print("| router | chunks relayed | router CPU µs/chunk | router CPU % | gap p99 ms "
              "| notes |")  # fmt: skip
        print("|---|--:|--:|--:|--:|---|")
        for r in summary["streams"]:
            notes = [f"{r['errors']} streams failed"] if r["errors"] else []
            notes += [f"failed: {f}" for f in r["failures"]]
            print(f"| {label(r['router'])} | {_f(r['chunks'], ',.0f')} "
                  f"| {_f(r['us_per_chunk'], '.1f')} | {_f(r['cpu_percent'], '.0f')} "
                  f"| {_f(r['gap_p99_ms'], '.1f')} | {'; '.join(notes)} |")  # fmt: skip
    for name, reason in skipped.items():
        print(f"{label(name)}: skipped ({reason.splitlines()[0]})")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=10.0, help="seconds measured at c=32")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--routers", default=",".join(ROUTERS), help="comma-separated, of: %(default)s")
    p.add_argument("--bodies", default=",".join(BODIES), help="comma-separated, of: %(default)s")
    p.add_argument("--streams", type=int, default=1000, help="concurrent SSE streams (0: none)")
    p.add_argument("--stream-rate", type=float, default=10.0, help="chunks a second per stream")
    p.add_argument("--runs", type=int, default=3, help="runs; each figure is their median")
    p.add_argument(
        "--crossbar-python",
        default=sys.executable,
        help="the Python whose venv's twistd runs crossbar (default: this one)",
    )
    p.add_argument("--json", action="store_true", help="print the raw runs and medians as JSON")
    args = p.parse_args(argv)
    args.routers = [r.strip() for r in args.routers.split(",") if r.strip()]
    args.bodies = [b.strip() for b in args.bodies.split(",") if b.strip()]
    unknown = sorted(set(args.routers) - set(ROUTERS)) + sorted(set(args.bodies) - set(BODIES))
    if unknown or not args.bodies:
        what = ", ".join(unknown) or "(no body)"
        p.error(f"unknown {what}; routers: {ROUTERS}, bodies: {BODIES}")
    if "direct" not in args.routers:  # the baseline of "added"
        args.routers.insert(0, "direct")
    args.routers.sort(key=ROUTERS.index)
    if args.runs < 1 or args.duration <= 0 or args.warmup < 0 or args.streams < 0:
        p.error("--runs must be at least 1, --duration positive, --warmup and --streams >= 0")
    if "crossbar" in args.routers and not (Path(args.crossbar_python).parent / "twistd").exists():
        p.error(f"--crossbar-python: no twistd beside {args.crossbar_python}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = [tool for tool in ("nginx", "wrk") if shutil.which(tool) is None]
    if missing:
        print(f"bench: needs {' and '.join(missing)} on PATH (Debian: apt-get install "
              "nginx-light wrk); nothing measured", file=sys.stderr)  # fmt: skip
        return 2
    out = sys.stderr if args.json else sys.stdout  # --json: stdout is the JSON alone
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"load average before: {' '.join(load)}; {os.cpu_count()} cores", file=out, flush=True)
    if float(load[0]) > 1:
        warning = f"WARNING: load average {load[0]} is above 1: something else is running; "
        print(warning + "latency and req/s will be off, CPU per request less so", file=out)
    checkout = crossbar_checkout(args.crossbar_python) if "crossbar" in args.routers else None
    if checkout:
        print(f"crossbar from {checkout}", file=out, flush=True)
    skipped = {}
    for name in [r for r in args.routers if r in PEER_OF]:
        try:
            peer_routers.ensure_installed(PEER_OF[name][0])
        except peer_routers.PeerUnavailable as e:
            skipped[name] = str(e)
            print(f"skipping {name}: {e}", file=sys.stderr, flush=True)
    routers = [r for r in args.routers if r not in skipped]
    # streams: a socket each here, two in a router
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 4 * args.streams + 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    result: dict[str, Any] = {}

    def body(processes: Processes, work: Path) -> int:
        print(f"logs of every process in {work}", file=sys.stderr, flush=True)
        sitting = Sitting(args, processes, work, skipped=skipped)
        began = time.monotonic()
        runs = []
        for i in range(args.runs):
            print(f"run {i + 1} of {args.runs}", file=sys.stderr, flush=True)
            runs.append(one_run(sitting, routers))
        result["runs"] = runs
        result["summary"] = summarize(runs, routers, args.bodies)
        result["seconds"] = time.monotonic() - began
        failed = any(r["failures"] for r in result["summary"]["table"]) or any(
            r["failures"] for r in result["summary"]["streams"]
        )
        return 1 if failed else 0

    status = with_processes("peers", body)
    if "summary" not in result:
        return status or 1
    if args.json:
        result.update(load_before=load, skipped=skipped, routers=routers, bodies=args.bodies,
                      crossbar_checkout=checkout, options=vars(args))  # fmt: skip
        print(json.dumps(result, indent=2))
    else:
        report(result["summary"], args, skipped)
        print(f"\nthe sitting took {result['seconds']:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
