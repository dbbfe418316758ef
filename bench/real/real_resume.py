"""What a user feels when the host streaming their answer dies: real llama-servers, one killed
(SIGKILL) mid-answer, through crossbar (which continues the answer on the other host), crossbar
with `resume_attempts = 0`, smg and vllm-router (whose client must send the turn again).

    .venv/bin/python bench/real/real_resume.py [--routers crossbar,crossbar-off,smg,vllm-router]
        [--runs 3] [--history 2000] [--reply 300] [--kill-after 150] [--json]

Each run starts two llama-servers afresh per router (`make real`'s build, `-np 2 -c 8192 -t 1
--cache-ram 24 --no-repack`) and the router in front of them, then sends one conversation: a
first turn (not streamed, 8 tokens) so its `--history`-token prompt is cached on its host, then
the next turn streamed (`max_tokens` `--reply`, `ignore_eos`, temperature 0). After
`--kill-after` content chunks the host serving it is SIGKILLed (crossbar and smg name it in a
header; for vllm-router the host whose `/slots` is busy). The client does what an agent does:
a stream that ends without its end (an error event, a broken connection) is sent again whole,
streamed, at once, up to twice. Per run: the time from the turn's send to its last token (to
finish), the longest wait between two content chunks the user saw (the stall), the text the
user was sent twice (a retry repeats all it had), whether the answer ended whole (a finish
reason; the tokens it counts), and the router's CPU seconds over the turn. The routers run in
a rotated order each run (before and after alternated in one sitting); medians and ranges are
printed. Ports 26000-26999. About 1.5 minutes a router a run on 2 quiet cores.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

from twisted.internet.threads import deferToThread

from bench.common.measure import PortPicker, cpu_seconds, react, with_processes
from bench.peers import peer_routers
from bench.real import real_cache
from crossbar.demo.plan import DemoError
from crossbar.demo.processes import Processes, stop

ROUTERS = ("crossbar", "crossbar-off", "smg", "vllm-router")
PEERS = ("smg", "vllm-router")
PORTS = range(26000, 27000)  # this bench's share of the machine's ports
RETRIES = 2  # times the client sends a broken turn again
WORDS = (
    "The lighthouse keeper kept a log of every ship, every storm and every quiet night; "
    "the sea changed its colour with the hours and the keeper wrote that down as well. "
)


@dataclass
class Turn:
    """One streamed turn as the user saw it."""

    router: str
    finish_s: float = 0.0  # send to the last token of the answer that ended whole
    stall_s: float = 0.0  # the longest wait between two content chunks
    first_s: float = 0.0  # send to the first token
    repeated_chars: int = 0  # text the user was sent twice (a retry starts over)
    attempts: int = 1
    whole: bool = False  # the answer ended with a finish reason
    finish_reason: str = ""
    completion_tokens: int | None = None
    router_cpu_s: float = 0.0
    killed: str = ""
    error: str = ""


def history(tokens: int) -> list[dict[str, str]]:
    """A conversation of about `tokens` prompt tokens (about 4 characters a token)."""
    text = WORDS * max(1, tokens * 4 // len(WORDS))
    return [
        {"role": "system", "content": "You are a storyteller. " + text},
        {"role": "user", "content": "Tell me the story of that lighthouse keeper."},
    ]


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    """A plain POST, read whole."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=300)
    try:
        conn.request("POST", parts.path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def busy_host(hosts: dict[str, str]) -> str:
    """The host whose /slots shows a slot processing (how vllm-router's choice is found)."""
    for name, url in hosts.items():
        try:
            parts = urlsplit(url)
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=2)
            conn.request("GET", "/slots")
            slots = json.loads(conn.getresponse().read())
            conn.close()
        except (OSError, ValueError):
            continue
        if any(s.get("is_processing") for s in slots):
            return name
    return ""


def stream_turn(
    url: str, body: dict[str, Any], kill: Any, kill_after: int, turn: Turn
) -> tuple[str, list[float]]:
    """One streamed attempt: its text, the times of its content chunks; `kill(headers)` is
    called once after `kill_after` content chunks (None: never). Sets the turn's finish."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=300)
    text, times = "", []
    try:
        conn.request("POST", parts.path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        headers = {k.lower(): v for k, v in r.getheaders()}
        if r.status != 200:
            turn.error = f"HTTP {r.status}: {r.read()[:200]!r}"
            return text, times
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                turn.error = str(event["error"].get("message", event["error"]))[:200]
                break
            for choice in event.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    text += piece
                    times.append(time.monotonic())
                    if kill is not None and len(times) == kill_after:
                        kill(headers)
                        kill = None
                if choice.get("finish_reason"):
                    turn.whole, turn.finish_reason = True, choice["finish_reason"]
            usage = event.get("usage")
            if isinstance(usage, dict):
                turn.completion_tokens = usage.get("completion_tokens")
    except (OSError, http.client.HTTPException, ValueError) as e:
        turn.error = f"{type(e).__name__}: {e}"[:200]
    finally:
        conn.close()
    return text, times


def killer(router: str, hosts: dict[str, Any], turn: Turn) -> Callable[[dict[str, str]], None]:
    """What kills the host serving a turn, from its answer's headers: the one crossbar or smg
    names, else the one whose /slots is busy (vllm-router names none)."""
    header = "x-crossbar-host" if router.startswith("crossbar") else ""
    header = "x-smg-routed-worker-id" if router == "smg" else header

    def kill(headers: dict[str, str]) -> None:
        named = headers.get(header, "") if header else ""
        by_url = {h["url"]: name for name, h in hosts.items()}
        name = named if named in hosts else by_url.get(named.rstrip("/"), "")
        name = name or busy_host({n: h["url"] for n, h in hosts.items()})
        if name:
            os.kill(hosts[name]["pid"], signal.SIGKILL)
            turn.killed = name

    return kill


def run_turn(
    turn: Turn, url: str, body: dict[str, Any], kill: Callable[[dict[str, str]], None], after: int
) -> Turn:
    """The streamed turn, `kill` called after `after` content chunks, and sent again whole
    while it is broken, as an agent does."""
    sent = time.monotonic()
    seen: list[float] = []
    text, times = stream_turn(url, body, kill, after, turn)
    seen += times
    while not turn.whole and turn.attempts <= RETRIES:
        turn.repeated_chars += len(text)  # the user had this; the retry sends it again
        turn.attempts += 1
        turn.error = ""
        text, times = stream_turn(url, body, None, 0, turn)
        seen += times
    if seen:
        turn.first_s = seen[0] - sent
        turn.finish_s = seen[-1] - sent if turn.whole else 0.0
        turn.stall_s = max((b - a for a, b in pairwise(seen)), default=0.0)
    return turn


async def one(reactor: Any, s: real_cache.Sitting, router: str) -> Turn:
    """One router's run, from fresh hosts to its turn; its processes stopped after."""
    args, cache = s.args, s
    s.runs += 1
    try:
        urls = await real_cache.start_hosts(reactor, cache, router)
        started = s.processes.started[-len(urls) :]
        hosts = {
            name: {"url": url, "pid": p.pid}
            for (name, url), p in zip(urls.items(), started, strict=True)
        }
        if router.startswith("crossbar"):
            keys = f"resume_attempts = {0 if router == 'crossbar-off' else 1}\n"
            process, chat, _ = await real_cache.start_crossbar(reactor, cache, urls, keys)
        else:
            port, prometheus = s.ports.take(2)
            workers = list(urls.values())
            process = peer_routers.launch(
                s.processes, router, port, workers, "cache_aware", prometheus, label=router
            )
            base = f"http://127.0.0.1:{port}"
            await peer_routers.wait_ready(reactor, process, base, len(urls))
            chat = f"{base}/v1/chat/completions"
        messages = history(args.history)
        first = {"model": real_cache.MODEL, "messages": messages, "max_tokens": 8}
        status, _, _ = await deferToThread(post, chat, first)
        if status != 200:
            return Turn(router, error=f"first turn: HTTP {status}")
        body = {
            **first,
            "max_tokens": args.reply,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        before = cpu_seconds(process.pid)
        turn = Turn(router)
        kill = killer(router, hosts, turn)
        await deferToThread(run_turn, turn, chat, body, kill, args.kill_after)
        turn.router_cpu_s = cpu_seconds(process.pid) - before
        return turn
    except (DemoError, peer_routers.PeerUnavailable) as e:
        return Turn(router, error=str(e)[:300])
    finally:
        stop(list(reversed(s.processes.started)))
        s.processes.started.clear()


def summary(turns: list[Turn]) -> dict[str, Any]:
    """Medians and ranges of one router's runs."""
    ok = [t for t in turns if t.whole]

    def spread(name: str) -> list[float]:
        values = [getattr(t, name) for t in ok]
        if not values:
            return []
        return [statistics.median(values), min(values), max(values)]

    return {
        "runs": len(turns),
        "whole": len(ok),
        "finish_s": spread("finish_s"),
        "stall_s": spread("stall_s"),
        "first_s": spread("first_s"),
        "repeated_chars": spread("repeated_chars"),
        "attempts": spread("attempts"),
        "router_cpu_s": spread("router_cpu_s"),
        "tokens": sorted({t.completion_tokens for t in ok if t.completion_tokens is not None}),
        "errors": [t.error for t in turns if t.error],
    }


def report(rows: dict[str, dict[str, Any]], out: TextIO) -> None:
    def cell(v: list[float], unit: str = "") -> str:
        if not v:
            return "-"
        return f"{v[0]:.2f}{unit} ({v[1]:.2f}-{v[2]:.2f})"

    print(
        "| router | whole | to finish | stall | chars sent twice | attempts | router CPU |",
        file=out,
    )
    print("|---|--:|--:|--:|--:|--:|--:|", file=out)
    for router, r in rows.items():
        print(
            f"| {router} | {r['whole']}/{r['runs']} | {cell(r['finish_s'], ' s')} "
            f"| {cell(r['stall_s'], ' s')} | {cell(r['repeated_chars'])} "
            f"| {cell(r['attempts'])} | {cell(r['router_cpu_s'], ' s')} |",
            file=out,
        )
    for router, r in rows.items():
        for error in r["errors"]:
            print(f"{router}: {error}", file=out)


async def sitting(reactor: Any, s: real_cache.Sitting) -> None:
    args = s.args
    turns: dict[str, list[Turn]] = {r: [] for r in args.routers}
    for run in range(args.runs):
        order = args.routers[run % len(args.routers) :] + args.routers[: run % len(args.routers)]
        for router in order:
            print(f"run {run + 1}: {router}", file=s.progress, flush=True)
            turn = await one(reactor, s, router)
            print(f"  {asdict(turn)}", file=s.progress, flush=True)
            turns[router].append(turn)
    rows = {router: summary(ts) for router, ts in turns.items()}
    if args.json:
        print(json.dumps({"args": vars(args), "rows": rows}, indent=2, default=str))
    else:
        print(file=s.progress)
        report(rows, s.progress)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--routers", default=",".join(ROUTERS), help="comma-separated, of: %(default)s")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--history", type=int, default=2000, help="prompt tokens of the conversation")
    p.add_argument("--reply", type=int, default=300, help="tokens of the streamed answer")
    p.add_argument("--kill-after", type=int, default=150, help="content chunks before the kill")
    p.add_argument("--crossbar-python", default=sys.executable)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    args.routers = [r.strip() for r in args.routers.split(",") if r.strip()]
    unknown = sorted(set(args.routers) - set(ROUTERS))
    if unknown or not args.routers:
        p.error(f"--routers: unknown {', '.join(unknown) or '(none given)'}; known: {ROUTERS}")
    if not 0 < args.kill_after < args.reply:
        p.error("--kill-after must be between 0 and --reply")
    if args.runs < 1:
        p.error("--runs must be at least 1")
    args.hosts = 2
    args.llama_server = os.environ.get("LLAMA_SERVER") or str(real_cache.LLAMA_SERVER)
    args.llama_model = os.environ.get("LLAMA_MODEL") or str(real_cache.LLAMA_MODEL)
    for what, path in (("LLAMA_SERVER", args.llama_server), ("LLAMA_MODEL", args.llama_model)):
        if not Path(path).is_file():
            p.error(f"{what}: no {path} (run `make real`, or set {what})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    load = os.getloadavg()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in load)}", file=out)
    if load[0] > 1:
        print("warning: the machine is not quiet (load average above 1)", file=out)
    skipped = peer_routers.install_all([r for r in args.routers if r in PEERS], out)
    args.routers = [r for r in args.routers if r not in skipped]

    def body(processes: Processes, work: Path) -> int:
        ports = PortPicker(PORTS)
        s = real_cache.Sitting(args, processes, work, out, skipped, load, ports)
        return react(lambda reactor: sitting(reactor, s))

    return with_processes("real-resume", body)


if __name__ == "__main__":
    raise SystemExit(main())
