"""The agent workload of bench/real_cache.py, with no router in it: conversations that share a
system prompt, each turn the whole conversation so far as one chat completion, a few running
at once; where each request goes (`Target`), which host served it (`HostOf`), what its answer
says was prefilled and cached (`account`), and the table of a sitting (`summarize`, `report`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from measure import (
    BytesProducer,
    Reader,
    percentile,
)
from twisted.internet import defer
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.http_headers import Headers

MODEL = "gemma"
TURN_SECONDS = 300.0  # one answer, queued behind others on a busy 2-core machine

# About 330 tokens for Gemma 3's tokenizer with the chat template's markers (two first turns
# share 333), the same in every conversation: the prefix a cache-aware router may find anywhere.
SYSTEM_PROMPT = """\
You are Forge, a careful coding agent working inside a developer's repository. You read files, \
run commands and propose small, reviewable changes. Follow these rules in every answer.

1. Before you change anything, say in one sentence what you will change and why. Prefer the \
smallest change that fixes the problem; never rewrite a module to fix one line.
2. Keep the existing style of the code: its naming, its formatting, its error handling and its \
tests. If the project has a style guide, it wins over your habits.
3. Never invent an API. When you are not sure that a function, flag or option exists, say so and \
tell the developer how to check, instead of guessing.
4. Every change comes with a test that fails before it and passes after it, unless the \
developer says otherwise. Name the test after the rule it checks.
5. Commands you propose must be safe to run twice. Never delete data, force-push, or touch \
files outside the repository without asking first.
6. When a command fails, read its output before trying again; quote the line that matters and \
say what you think it means.
7. Keep answers short: the developer reads many of them. Use plain sentences, no marketing \
words, and code blocks only for code and commands.
8. Report what you did at the end of each task: the files changed, the tests run and their \
results, and anything left undone.

The developer uses Linux, Python 3.11, pytest and ruff."""

FIRST_TASKS = (
    "the retry loop in client.py sleeps even after the last attempt",
    "the CSV exporter drops rows whose name contains a comma",
    "the config loader ignores an empty TIMEOUT variable instead of failing",
    "the cache key for user sessions forgets the tenant id",
    "the progress bar prints past 100% on files larger than 2 GiB",
    "the date parser reads 01/02/2024 as February in every locale",
    "the upload handler keeps the temp file when the client disconnects",
    "the scheduler runs a cron job twice across a daylight-saving change",
    "the password reset link never expires",
)
NEXT_ASKS = (
    "Show me the smallest fix.",
    "Now write the test for it.",
    "Run the tests: what do you expect to see?",
    "Summarise what you changed.",
)


@dataclass(frozen=True)
class Workload:
    """What every router is given: conversations, turns each, how many run at once."""

    conversations: int = 9
    turns: int = 5
    at_once: int = 3
    max_tokens: int = 24
    system: str = SYSTEM_PROMPT


def first_message(conversation: int) -> str:
    """Conversation `conversation`'s first user message: its own task, so no two share more
    than the system prompt."""
    task_ = FIRST_TASKS[conversation % len(FIRST_TASKS)]
    return f"Task {conversation + 1}: {task_}. Find the cause."


def next_message(turn: int) -> str:
    """The user message of turn `turn` (2..T), after the assistant's last reply."""
    return NEXT_ASKS[(turn - 2) % len(NEXT_ASKS)]


def request_body(workload: Workload, messages: list[dict[str, str]]) -> bytes:
    """One turn's request: the conversation so far, greedy, short reply, not streamed."""
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": workload.max_tokens,
        "temperature": 0,
        "stream": False,
    }
    return json.dumps(body).encode()


@dataclass
class TurnResult:
    """One turn as the client saw it. `prompt_n`/`cache_n` are the prompt tokens the host
    processed and read from its cache; `from_timings` False: taken from `usage` instead."""

    conversation: int
    turn: int  # 1..T
    seconds: float = 0.0
    status: int = 0
    host: str = ""  # where it went, when the router says (or the client chose)
    prompt_n: int = 0
    cache_n: int = 0
    from_timings: bool = True
    error: str = ""


def account(answer: dict[str, Any]) -> tuple[int, int, bool]:
    """(prompt_n, cache_n, from_timings) of one chat answer: llama-server's `timings`, else
    `usage` (prompt_tokens less prompt_tokens_details.cached_tokens). ValueError if neither."""
    timings = answer.get("timings")
    if isinstance(timings, dict) and "prompt_n" in timings:
        return int(timings["prompt_n"]), int(timings.get("cache_n", 0)), True
    usage = answer.get("usage")
    if not isinstance(usage, dict) or "prompt_tokens" not in usage:
        raise ValueError(f"an answer with neither timings nor usage: {str(answer)[:200]}")
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    return int(usage["prompt_tokens"]) - cached, cached, False


# Where one request goes: (conversation, turn) -> the chat completions URL.
Target = Callable[[int, int], str]


def ideal(urls: list[str]) -> Target:
    """Conversation i to host i mod N, every turn: a router that knows the conversations."""
    return lambda conversation, _turn: urls[conversation % len(urls)]


def round_robin(urls: list[str]) -> Target:
    """Each request to the next host in turn, whatever conversation it belongs to."""
    sent = iter(range(sys.maxsize))
    return lambda _conversation, _turn: urls[next(sent) % len(urls)]


def through(url: str) -> Target:
    """Every request to one router."""
    return lambda _conversation, _turn: url


# Names the host a request went to from its answer's headers and the URL it was sent to.
HostOf = Callable[[Headers, str], str]


def sent_to(names: dict[str, str]) -> HostOf:
    """The host is the URL the client picked (straight to the hosts): its name in `names`."""
    return lambda _headers, url: names.get(url, url)


def header_host(header: bytes, names: dict[str, str]) -> HostOf:
    """The router says where it sent the request in `header` (a name, or a host URL that
    `names` maps from its base URL to a name)."""

    def host_of(headers: Headers, _url: str) -> str:
        value = (headers.getRawHeaders(header) or [b""])[0].decode(errors="replace")
        return names.get(value.rstrip("/"), value)

    return host_of


async def run_workload(
    reactor: Any,
    target: Target,
    workload: Workload,
    host_of: HostOf,
    progress: TextIO | None = None,
) -> list[TurnResult]:
    """Every conversation of `workload`, `at_once` at a time, each turn sent once the last
    one's answer is in; a conversation whose turn fails (not 200, no reply, no token counts)
    ends there, with that turn's error. The results in (conversation, turn) order."""
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = workload.at_once
    pool.retryAutomatically = False
    agent = Agent(reactor, pool=pool)
    results: list[TurnResult] = []
    gate = defer.DeferredSemaphore(workload.at_once)

    async def conversation(i: int) -> None:
        messages = [
            {"role": "system", "content": workload.system},
            {"role": "user", "content": first_message(i)},
        ]
        for turn in range(1, workload.turns + 1):
            if turn > 1:
                messages.append({"role": "user", "content": next_message(turn)})
            result = TurnResult(i, turn)
            results.append(result)
            url = target(i, turn)
            reply = await one_turn(reactor, agent, url, workload, messages, host_of, result)
            if reply is None:
                break
            messages.append({"role": "assistant", "content": reply})
        if progress is not None:
            done = sum(1 for r in results if r.status)
            print(
                f"    conversation {i + 1} ended ({done} turns so far)", file=progress, flush=True
            )

    try:
        await defer.gatherResults(
            [
                defer.ensureDeferred(gate.run(conversation, i))
                for i in range(workload.conversations)
            ],
            consumeErrors=True,
        )
    finally:
        await pool.closeCachedConnections()
    return sorted(results, key=lambda r: (r.conversation, r.turn))


async def one_turn(
    reactor: Any,
    agent: Agent,
    url: str,
    workload: Workload,
    messages: list[dict[str, str]],
    host_of: HostOf,
    result: TurnResult,
) -> str | None:
    """Send one turn and fill `result`; the reply's text, or None (and `result.error`)."""
    headers = Headers({b"Content-Type": [b"application/json"]})
    body = BytesProducer(request_body(workload, messages))
    started = reactor.seconds()
    try:
        response = await agent.request(b"POST", url.encode(), headers, body).addTimeout(
            TURN_SECONDS, reactor
        )
        reader = Reader(reactor)
        response.deliverBody(reader)
        data = await reader.done.addTimeout(TURN_SECONDS, reactor)
    except Exception as e:
        result.seconds = reactor.seconds() - started
        result.error = f"{type(e).__name__}: {e}"
        return None
    result.seconds = reactor.seconds() - started
    result.status = response.code
    result.host = host_of(response.headers, url)
    if response.code != 200:
        result.error = f"HTTP {response.code}: {data[:200].decode(errors='replace')}"
        return None
    try:
        answer = json.loads(data)
        reply = answer["choices"][0]["message"]["content"]
        result.prompt_n, result.cache_n, result.from_timings = account(answer)
    except (ValueError, KeyError, IndexError, TypeError) as e:
        text = data[:200].decode(errors="replace")
        result.error = f"bad answer ({type(e).__name__}: {e}): {text}"
        return None
    return str(reply)


@dataclass
class Row:
    """One router's numbers in a sitting; seconds are wall or CPU seconds."""

    router: str
    expected: int = 0  # turns the workload has
    answered: int = 0  # turns answered 200 with token counts
    prefill: int = 0  # prompt tokens the hosts processed (not from cache)
    cached: int = 0
    ratio: float | None = None  # prefill / ideal's
    later_cached_share: float | None = None  # turns 2..T
    p50_s: float = 0.0
    p95_s: float = 0.0
    wall_s: float = 0.0
    router_cpu_s: float | None = None
    hosts_cpu_s: float | None = None
    timings_stripped: bool = False  # some answer had no `timings`: `usage` counted instead
    first_hosts: list[str] = field(default_factory=list)
    # turns each host served, from its own log: also for a router that does not say where
    host_turns: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    error: str = ""  # the first error: a turn's, or why the run could not start
    turns: list[TurnResult] = field(default_factory=list)  # in --json only


def summarize(router: str, results: list[TurnResult], workload: Workload) -> Row:
    """The row of one router's turns (wall and CPU seconds are the caller's)."""
    good = [r for r in results if r.status == 200 and not r.error]
    later = [r for r in good if r.turn > 1]
    later_total = sum(r.cache_n + r.prompt_n for r in later)
    seconds = [r.seconds for r in good]
    failed = [r for r in results if r.error]
    firsts = {r.conversation: r.host or "-" for r in results if r.turn == 1}
    return Row(
        router,
        expected=workload.conversations * workload.turns,
        answered=len(good),
        prefill=sum(r.prompt_n for r in good),
        cached=sum(r.cache_n for r in good),
        later_cached_share=sum(r.cache_n for r in later) / later_total if later_total else None,
        p50_s=percentile(seconds, 50),
        p95_s=percentile(seconds, 95),
        timings_stripped=any(not r.from_timings for r in good),
        first_hosts=[firsts[c] for c in sorted(firsts)],
        errors=len(failed),
        error=failed[0].error if failed else "",
        turns=results,
    )


def with_ratios(rows: list[Row]) -> list[Row]:
    """Each row's prefill over `ideal`'s, when ideal ran whole."""
    base = next((r for r in rows if r.router == "ideal" and not r.errors and r.prefill), None)
    for row in rows:
        row.ratio = row.prefill / base.prefill if base is not None and row.answered else None
    return rows


def report(rows: list[Row], out: TextIO) -> None:
    """The rows as an aligned table, then each router's first-turn hosts and notes."""
    head = (
        f"{'router':<13}{'prefill':>9}{'x ideal':>9}{'later cached':>14}{'p50 s':>8}{'p95 s':>8}"
        f"{'wall s':>8}{'router cpu s':>14}{'hosts cpu s':>13}{'answered':>10}"
    )
    print(head, file=out)
    print("-" * len(head), file=out)

    def num(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    for r in rows:
        share = num(None if r.later_cached_share is None else 100 * r.later_cached_share, ".0f")
        print(
            f"{r.router:<13}{r.prefill:>9,}{num(r.ratio, '.2f'):>9}"
            f"{share + ('%' if share != '-' else ''):>14}{r.p50_s:>8.2f}{r.p95_s:>8.2f}"
            f"{r.wall_s:>8.1f}{num(r.router_cpu_s, '.2f'):>14}{num(r.hosts_cpu_s, '.1f'):>13}"
            f"{f'{r.answered}/{r.expected}':>10}",
            file=out,
        )
    print(file=out)
    for r in rows:
        if r.first_hosts:
            print(f"{r.router}: first turns went to {' '.join(r.first_hosts)}", file=out)
    for r in rows:
        if r.host_turns:
            each = ", ".join(f"{name} {n}" for name, n in r.host_turns.items())
            print(f"{r.router}: turns per host (the hosts' logs): {each}", file=out)
    for r in rows:
        if r.timings_stripped:
            print(f"{r.router}: answers without `timings`: counted from `usage`", file=out)
        if r.error:
            print(f"{r.router}: {r.errors} error(s), the first: {r.error}", file=out)
