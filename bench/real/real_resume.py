"""What a user feels when the host streaming their answer dies: real llama-servers, one killed
(SIGKILL) mid-answer, through crossbar (which continues the answer on the other host in the same
stream), crossbar with `resume_attempts = 0`, smg and vllm-router (`--policy cache_aware`; their
client must send the turn again).

    .venv/bin/python bench/real/real_resume.py [--routers crossbar,crossbar-off,smg,vllm-router]
        [--runs 3] [--history 3000] [--reply 300] [--kill-after 40] [--json]

Each run starts two llama-servers afresh per router (`make real`'s build, `-np 2 -c 8192 -t 1
--cache-ram 24 --no-repack`) and the router in front of them, then sends one conversation of
about `--history` prompt tokens (a system prompt and three earlier exchanges) once, not
streamed (8 tokens), so its prompt is cached on its host; then its next turn (that reply and a
new question) streamed over raw HTTP (`max_tokens` `--reply`, `ignore_eos`, temperature 0).
After `--kill-after` content chunks the host serving it is SIGKILLed (crossbar names it in
`X-Crossbar-Host`, smg in `x-smg-routed-worker-id`; for vllm-router the host whose `/slots` is
busy). The client does what an agent does: a stream that ends before its end (an error event,
a broken connection) is sent again whole, streamed, at once, once; if that breaks too the run
is a failure. Per run: the time from the turn's send to the last token of the whole answer (to
finish), the longest wait between two content chunks the user saw (the stall), the text the
user was sent twice or threw away (a retry: all it had; a continuation: none), whether the
answer ended whole (a finish reason, and its `completion_tokens`), whether its text is the
answer an uninterrupted run gives (the sitting's retries are such runs: they are the
reference) and the CPU seconds of the router's process tree over the turn.

Prints the load average first (a warning above 1: the numbers are then not quiet), a line per
run, then per router the median and range over runs, and one line: crossbar's time to finish
and stall against each other router's. `--json` prints every run and the summary as JSON
instead. Every process's log is kept in a directory printed at the start. The routers' order
is reversed every other run (before and after alternated in one sitting). Ports 26000-26999.
About a minute a router a run on 2 quiet cores (12 minutes for the default sitting).
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
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

from twisted.internet.threads import deferToThread

from bench.common.measure import PortPicker, react, tree_cpu_seconds, with_processes
from bench.peers import peer_routers
from bench.real import real_cache
from crossbar.demo.plan import DemoError
from crossbar.demo.processes import Processes, stop

ROUTERS = ("crossbar", "crossbar-off", "smg", "vllm-router")
PEERS = ("smg", "vllm-router")
PORTS = range(26000, 27000)  # this bench's share of the machine's ports
RETRIES = 1  # times the client sends a broken turn again, as an agent does, before it gives up
WORDS = (
    "The lighthouse keeper kept a log of every ship, every storm and every quiet night; "
    "the sea changed its colour with the hours and the keeper wrote that down as well. "
)
ASKS = (
    "Who was the lighthouse keeper?",
    "What did the keeper write in the log on stormy nights?",
    "And what happened on the quiet nights?",
)
NEXT = "Now tell me the whole story of that lighthouse keeper, from the beginning."


@dataclass
class Turn:
    """One streamed turn as the user saw it."""

    router: str
    finish_s: float = 0.0  # send to the last token of the answer that ended whole
    stall_s: float = 0.0  # the longest wait between two content chunks
    first_s: float = 0.0  # send to the first token
    repeated_chars: int = 0  # text the user was sent twice or threw away (a retry starts over)
    chars_at_kill: int = 0  # text the user had when the host was killed
    attempts: int = 1
    whole: bool = False  # the answer ended with a finish reason
    finish_reason: str = ""
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    resumed: int | None = None  # crossbar's usage says how many times the answer moved
    router_cpu_s: float = 0.0
    killed: str = ""  # the host killed
    breaks: list[str] = field(default_factory=list)  # why each broken attempt ended
    error: str = ""  # why the turn failed (no whole answer)
    answer: str = ""  # the whole answer's text
    same_as_reference: bool | None = None  # None: no uninterrupted answer to compare with
    diverges_at: int | None = None  # the first character that differs from it


def history(tokens: int) -> list[dict[str, str]]:
    """A conversation of about `tokens` prompt tokens (about 4 characters a token): a system
    prompt, three earlier exchanges, the user's latest question."""

    def text(share: float) -> str:
        return WORDS * max(1, int(tokens * 4 * share) // len(WORDS))

    messages = [{"role": "system", "content": "You are a storyteller. " + text(0.4)}]
    for ask in ASKS:
        messages += [{"role": "user", "content": ask}, {"role": "assistant", "content": text(0.2)}]
    return [*messages, {"role": "user", "content": "Tell me about the lighthouse keeper's sea."}]


def connect(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """A connection to `url`'s host and its path."""
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout), parts.path


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    """A plain POST, read whole."""
    conn, path = connect(url, 300)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def busy_host(hosts: dict[str, str]) -> str:
    """The host whose /slots shows a slot processing (how vllm-router's choice is found)."""
    for name, url in hosts.items():
        try:
            conn, _ = connect(url, 2)
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
    called once after `kill_after` content chunks (None: never). Sets the turn's finish, or
    appends why the attempt broke to its breaks."""
    conn, path = connect(url, 300)
    text, times = "", list[float]()
    turn.whole, turn.finish_reason = False, ""
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        headers = {k.lower(): v for k, v in r.getheaders()}
        if r.status != 200:
            turn.breaks.append(f"HTTP {r.status}: {r.read()[:200]!r}")
            return text, times
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                error = event["error"]
                message = error.get("message", error) if isinstance(error, dict) else error
                turn.breaks.append(f"error event: {message}"[:200])
                break
            for choice in event.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    text += piece
                    times.append(time.monotonic())
                    if kill is not None and len(times) == kill_after:
                        kill(headers)
                        kill = None
                        turn.chars_at_kill = len(text)
                if choice.get("finish_reason"):
                    turn.whole, turn.finish_reason = True, choice["finish_reason"]
            usage = event.get("usage")
            if isinstance(usage, dict):
                turn.completion_tokens = usage.get("completion_tokens")
                turn.prompt_tokens = usage.get("prompt_tokens")
                turn.resumed = usage.get("crossbar_resumed")
        else:
            if not turn.whole:
                turn.breaks.append("the stream ended without a finish reason")
    except (OSError, http.client.HTTPException, ValueError) as e:
        turn.breaks.append(f"{type(e).__name__}: {e}"[:200])
        turn.whole = False  # a finish reason then a broken connection is not a whole answer
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
    at once if it broke, as an agent does (RETRIES times)."""
    sent = time.monotonic()
    seen: list[float] = []
    text, times = stream_turn(url, body, kill, after, turn)
    seen += times
    while not turn.whole and turn.attempts <= RETRIES:
        turn.repeated_chars += len(text)  # the user had this; the retry sends it again
        turn.attempts += 1
        text, times = stream_turn(url, body, None, 0, turn)
        seen += times
    if turn.whole:
        turn.answer = text
    else:
        turn.error = turn.breaks[-1] if turn.breaks else "no whole answer"
    if seen:
        turn.first_s = seen[0] - sent
        turn.finish_s = seen[-1] - sent if turn.whole else 0.0
        turn.stall_s = max((b - a for a, b in pairwise(seen)), default=0.0)
    return turn


async def one(reactor: Any, s: real_cache.Sitting, router: str) -> Turn:
    """One router's run, from fresh hosts to its turn; its processes stopped after."""
    args = s.args
    s.runs += 1
    try:
        urls = await real_cache.start_hosts(reactor, s, router)
        started = s.processes.started[-len(urls) :]
        hosts = {
            name: {"url": url, "pid": p.pid}
            for (name, url), p in zip(urls.items(), started, strict=True)
        }
        if router.startswith("crossbar"):
            keys = f"resume_attempts = {0 if router == 'crossbar-off' else 1}\n"
            process, chat, _ = await real_cache.start_crossbar(reactor, s, urls, keys)
        else:
            port, prometheus = s.ports.take(2)
            label = f"{s.runs:02d}-{router}"
            process = peer_routers.launch(
                s.processes,
                router,
                port,
                list(urls.values()),
                "cache_aware",
                prometheus,
                label=label,
            )
            base = f"http://127.0.0.1:{port}"
            await peer_routers.wait_ready(reactor, process, base, len(urls))
            chat = f"{base}/v1/chat/completions"
        messages = history(args.history)
        # greedy from the first turn: every run then sends the same next turn, whose answers
        # (a retry's, a continuation's) are then comparable
        first = {"model": real_cache.MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}
        status, _, answer = await deferToThread(post, chat, first)
        if status != 200:
            return Turn(router, error=f"first turn: HTTP {status}: {answer[:200]!r}")
        reply = json.loads(answer)["choices"][0]["message"].get("content") or ""
        messages = [
            *messages,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": NEXT},
        ]
        body = {
            **first,
            "messages": messages,
            "max_tokens": args.reply,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        before = tree_cpu_seconds(process.pid)
        turn = Turn(router)
        kill = killer(router, hosts, turn)
        await deferToThread(run_turn, turn, chat, body, kill, args.kill_after)
        turn.router_cpu_s = tree_cpu_seconds(process.pid) - before
        return turn
    except (DemoError, peer_routers.PeerUnavailable) as e:
        return Turn(router, error=str(e)[:300])
    finally:
        stop(list(reversed(s.processes.started)))
        s.processes.started.clear()


def compare(turns: list[Turn]) -> str:
    """Mark each whole answer the same as the reference or not, and where it diverges; the
    reference is the commonest answer of a retry (an uninterrupted run: at temperature 0 it
    is the answer the turn has), "" when no retry ended whole."""
    retried = Counter(t.answer for t in turns if t.whole and t.attempts > 1)
    if not retried:
        return ""
    reference = retried.most_common(1)[0][0]
    for t in turns:
        if t.whole:
            t.same_as_reference = t.answer == reference
            if not t.same_as_reference:
                pairs = zip(t.answer, reference, strict=False)
                t.diverges_at = next(
                    (i for i, (a, b) in enumerate(pairs) if a != b),
                    min(len(t.answer), len(reference)),
                )
    return reference


def summary(turns: list[Turn]) -> dict[str, Any]:
    """Medians and ranges of one router's runs."""
    ok = [t for t in turns if t.whole]

    def spread(name: str) -> list[float]:
        values = [getattr(t, name) for t in ok]
        if not values:
            return []
        return [statistics.median(values), min(values), max(values)]

    compared = [t for t in ok if t.same_as_reference is not None]
    return {
        "runs": len(turns),
        "whole": len(ok),
        "finish_s": spread("finish_s"),
        "stall_s": spread("stall_s"),
        "first_s": spread("first_s"),
        "repeated_chars": spread("repeated_chars"),
        "attempts": spread("attempts"),
        "router_cpu_s": spread("router_cpu_s"),
        "same": [sum(bool(t.same_as_reference) for t in compared), len(compared)],
        "tokens": sorted({t.completion_tokens for t in ok if t.completion_tokens is not None}),
        "breaks": sorted(set(b for t in turns for b in t.breaks)),
        "errors": [t.error for t in turns if t.error],
    }


def cell(v: list[float], unit: str = "", digits: int = 2) -> str:
    """A median and its range, "-" for none."""
    if not v:
        return "-"
    if v[1] == v[2]:
        return f"{v[0]:.{digits}f}{unit}"
    return f"{v[0]:.{digits}f}{unit} ({v[1]:.{digits}f}-{v[2]:.{digits}f})"


def headline(rows: dict[str, dict[str, Any]]) -> str:
    """One line: crossbar's time to finish and stall against every other router's."""
    ours = rows.get("crossbar")
    if not ours or not ours["finish_s"]:
        return "crossbar: no whole answer" if ours else ""
    parts = []
    for router, r in rows.items():
        if router == "crossbar":
            continue
        if not r["finish_s"]:
            parts.append(f"{router} gave no whole answer ({r['whole']}/{r['runs']})")
            continue
        sooner = r["finish_s"][0] - ours["finish_s"][0]
        parts.append(
            f"{abs(sooner):.1f} s {'sooner' if sooner >= 0 else 'later'} than {router}"
            f" (stall {ours['stall_s'][0]:.1f} s vs {r['stall_s'][0]:.1f} s)"
        )
    against = "; ".join(parts) or "no other router ran"
    return f"crossbar finishes in {ours['finish_s'][0]:.1f} s: {against}"


def report(rows: dict[str, dict[str, Any]], out: TextIO) -> None:
    """The table, then the line, then what broke the streams and what failed."""
    print(
        "| router | whole | to finish | stall | first token | chars twice | attempts "
        "| same answer | tokens | router CPU |",
        file=out,
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|", file=out)
    for router, r in rows.items():
        same = f"{r['same'][0]}/{r['same'][1]}" if r["same"][1] else "-"
        tokens = ",".join(map(str, r["tokens"])) or "-"
        print(
            f"| {router} | {r['whole']}/{r['runs']} | {cell(r['finish_s'], ' s')} "
            f"| {cell(r['stall_s'], ' s')} | {cell(r['first_s'], ' s')} "
            f"| {cell(r['repeated_chars'], '', 0)} | {cell(r['attempts'], '', 0)} | {same} "
            f"| {tokens} | {cell(r['router_cpu_s'], ' s')} |",
            file=out,
        )
    print(headline(rows), file=out)
    for router, r in rows.items():
        for why in r["breaks"]:
            print(f"{router}: a stream broke: {why}", file=out)
        for error in r["errors"]:
            print(f"{router}: FAILED: {error}", file=out)


async def sitting(reactor: Any, s: real_cache.Sitting) -> None:
    """Every run, the routers' order reversed every other one, then the summary."""
    args = s.args
    turns: dict[str, list[Turn]] = {r: [] for r in args.routers}
    for run in range(args.runs):
        order = args.routers if run % 2 == 0 else args.routers[::-1]
        for router in order:
            print(f"run {run + 1}: {router}", file=s.progress, flush=True)
            turn = await one(reactor, s, router)
            shown = {k: v for k, v in asdict(turn).items() if k != "answer"}
            print(f"  {shown}", file=s.progress, flush=True)
            turns[router].append(turn)
    reference = compare([t for ts in turns.values() for t in ts])
    rows = {router: summary(ts) for router, ts in turns.items()}
    if args.json:
        document = {
            "args": vars(args),
            "load_before": s.load_before,
            "reference": reference,
            "rows": rows,
            "runs": {router: [asdict(t) for t in ts] for router, ts in turns.items()},
            "headline": headline(rows),
        }
        print(json.dumps(document, indent=2, default=str))
    else:
        print(file=s.progress)
        report(rows, s.progress)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; `--routers` is a comma-separated list of ROUTERS."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--routers", default=",".join(ROUTERS), help="comma-separated, of: %(default)s")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--history", type=int, default=3000, help="prompt tokens of the conversation")
    p.add_argument("--reply", type=int, default=300, help="tokens of the streamed answer")
    p.add_argument("--kill-after", type=int, default=40, help="content chunks before the kill")
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
    # 2 slots share -c 8192: a slot holds 4096 tokens, the conversation, its reply and margin
    if not 0 < args.history + args.reply <= 3800:
        p.error("--history plus --reply must be at most 3800 tokens (a slot holds 4096)")
    args.hosts = 2
    args.llama_server = os.environ.get("LLAMA_SERVER") or str(real_cache.LLAMA_SERVER)
    args.llama_model = os.environ.get("LLAMA_MODEL") or str(real_cache.LLAMA_MODEL)
    for what, path in (("LLAMA_SERVER", args.llama_server), ("LLAMA_MODEL", args.llama_model)):
        if not Path(path).is_file():
            p.error(f"{what}: no {path} (run `make real`, or set {what})")
    return args


def main(argv: list[str] | None = None) -> int:
    """Install the peers asked for, then run one sitting in this process's reactor."""
    args = parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    load = os.getloadavg()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in load)}", file=out)
    if load[0] > 1:
        print("WARNING: the machine is not quiet (load average above 1): numbers unquiet", file=out)
    skipped = peer_routers.install_all([r for r in args.routers if r in PEERS], out)
    args.routers = [r for r in args.routers if r not in skipped]

    def body(processes: Processes, work: Path) -> int:
        print(f"logs of every process in {work}", file=out, flush=True)
        ports = PortPicker(PORTS)
        s = real_cache.Sitting(args, processes, work, out, skipped, load, ports)
        return react(lambda reactor: sitting(reactor, s))

    # kept: crossbar's log says what each move cost (the tokens prefilled again)
    return with_processes("real-resume", body, keep=True)


if __name__ == "__main__":
    raise SystemExit(main())
