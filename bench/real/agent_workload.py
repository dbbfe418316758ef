"""The agent workload of bench/real/real_cache.py and bench/real/real_valve.py, with no router
in it: conversations that share a system prompt, each turn the whole conversation so far as one chat
completion (whole, or streamed and timed to its first token: `read_stream`), run in phases
(`Phase`: which conversations work at once, how many turns each, thinking how long before each);
where each request goes (`Target`), which host served it (`HostOf`), what its answer says was
prefilled and cached (`account`), and the table of a sitting (`summarize`, `report`).
"""

from __future__ import annotations

import json
import sys
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, TextIO

from twisted.internet import defer, task
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.http_headers import Headers

from bench.common.measure import (
    BytesProducer,
    Reader,
    percentile,
)

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
    # streamed (SSE, with `stream_options.include_usage`): each turn's first token is timed
    stream: bool = False
    # the model of conversation i is models[i % len(models)] (a router-mode fleet's several)
    models: tuple[str, ...] = (MODEL,)

    def model_of(self, conversation: int) -> str:
        """The model conversation `conversation` asks for."""
        return self.models[conversation % len(self.models)]


def first_message(conversation: int) -> str:
    """Conversation `conversation`'s first user message: its own task, so no two share more
    than the system prompt."""
    task_ = FIRST_TASKS[conversation % len(FIRST_TASKS)]
    return f"Task {conversation + 1}: {task_}. Find the cause."


def next_message(turn: int) -> str:
    """The user message of turn `turn` (2..T), after the assistant's last reply."""
    return NEXT_ASKS[(turn - 2) % len(NEXT_ASKS)]


def request_body(
    workload: Workload, messages: list[dict[str, str]], conversation: int = 0
) -> bytes:
    """One turn's request of `conversation`: the conversation so far, its model, greedy, short
    reply; streamed with the usage in the last chunk if `workload.stream`."""
    body: dict[str, Any] = {
        "model": workload.model_of(conversation),
        "messages": messages,
        "max_tokens": workload.max_tokens,
        "temperature": 0,
        "stream": workload.stream,
    }
    if workload.stream:
        body["stream_options"] = {"include_usage": True}
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
    # streamed turns: request sent to the first event that carries reply text
    ttft_s: float | None = None
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


@dataclass
class Streamed:
    """What a streamed chat answer said: the reply's text, an answer-shaped dict for `account`
    (the last `timings` and `usage` any chunk carried), and the arrival time of the first
    chunk that carried reply text (None: there was none)."""

    reply: str
    answer: dict[str, Any]
    first_content: float | None


def sse_events(data: bytes) -> Iterator[tuple[int, bytes]]:
    """Each server-sent event's data (its `data:` lines joined) with the offset just past the
    blank line that ended it (or past the end, for a last event that has none)."""
    offset, lines = 0, []
    for line in data.splitlines(keepends=True):
        offset += len(line)
        text = line.rstrip(b"\r\n")
        if text.startswith(b"data:"):
            value = text[5:]
            lines.append(value[1:] if value.startswith(b" ") else value)
        elif not text and lines:
            yield offset, b"\n".join(lines)
            lines = []
    if lines:
        yield offset, b"\n".join(lines)


def read_stream(chunks: list[bytes], times: list[float]) -> Streamed:
    """A streamed OpenAI chat answer, read from its body's chunks and their arrival `times`
    (measure.Reader's): an event counts as arrived with the chunk that held its last byte.
    Text is `delta.content` (or `delta.reasoning_content`, a thinking model's first tokens).
    llama-server puts `timings` in the last chunk and `usage` there when asked. ValueError for
    an error event or an event that is not JSON."""
    ends = list(accumulate(len(c) for c in chunks))
    pieces: list[str] = []
    answer: dict[str, Any] = {}
    first: float | None = None
    for offset, data in sse_events(b"".join(chunks)):
        if data == b"[DONE]":
            continue
        event = json.loads(data)
        if not isinstance(event, dict):
            raise ValueError(f"an event that is not an object: {data[:200]!r}")
        if "error" in event:
            raise ValueError(f"error event: {data[:200].decode(errors='replace')}")
        for key in ("timings", "usage"):
            if isinstance(event.get(key), dict):
                answer[key] = event[key]
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            text = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
            if text and first is None:
                first = times[min(bisect_left(ends, offset), len(times) - 1)]
            pieces.append(delta.get("content") or "")
    return Streamed("".join(pieces), answer, first)


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


@dataclass(frozen=True)
class Phase:
    """Conversations that work at once, `at_once` at a time (in their order, each starting as
    another finishes): conversation `conversations[i]` sends `len(thinks[i])` turns one after
    another, waiting `thinks[i][k]` seconds before its k-th (the think time of an agent between
    two turns). The next phase begins when every conversation of this one is done."""

    name: str
    conversations: tuple[int, ...]
    thinks: tuple[tuple[float, ...], ...]
    at_once: int

    @property
    def turns(self) -> int:
        """The turns of this phase, all conversations together."""
        return sum(len(t) for t in self.thinks)


def phases_of(workload: Workload) -> list[Phase]:
    """bench/real/real_cache.py's workload as one phase: every conversation `turns` turns with no
    thinking, `at_once` at a time."""
    thinks = ((0.0,) * workload.turns,) * workload.conversations
    return [Phase("all", tuple(range(workload.conversations)), thinks, workload.at_once)]


async def run_workload(
    reactor: Any,
    target: Target,
    workload: Workload,
    host_of: HostOf,
    progress: TextIO | None = None,
) -> list[TurnResult]:
    """Every conversation of `workload`, `at_once` at a time, each turn sent once the last
    one's answer is in (`run_phases` with `phases_of(workload)`)."""
    return await run_phases(reactor, target, workload, phases_of(workload), host_of, progress)


async def run_phases(
    reactor: Any,
    target: Target,
    workload: Workload,
    phases: list[Phase],
    host_of: HostOf,
    progress: TextIO | None = None,
) -> list[TurnResult]:
    """The phases one after another, every turn sent once its conversation's last answer is in
    and its think time has passed (`reactor`'s time: none is waited for a think time of 0); a
    conversation keeps its messages from phase to phase, its turns numbered on. One whose turn
    fails (not 200, no reply, no token counts) ends there, with that turn's error, and sends
    nothing in later phases. The results in (conversation, turn) order."""
    # llama-server (cpp-httplib) closes the connection after a streamed answer while its
    # headers say keep-alive: a turn sent on it at once would fail unanswered. Streamed turns
    # each take a new connection, to a router as to a host, so every router pays the same.
    pool = HTTPConnectionPool(reactor, persistent=not workload.stream)
    pool.maxPersistentPerHost = max((p.at_once for p in phases), default=1)
    pool.retryAutomatically = False
    agent = Agent(reactor, pool=pool)
    results: list[TurnResult] = []
    chats: dict[int, list[dict[str, str]]] = {}  # each conversation's messages so far
    failed: set[int] = set()
    last_phase = {c: n for n, phase in enumerate(phases) for c in phase.conversations}

    async def conversation(n: int, i: int, thinks: tuple[float, ...]) -> None:
        if i in failed:
            return
        opening = [
            {"role": "system", "content": workload.system},
            {"role": "user", "content": first_message(i)},
        ]
        messages = chats.setdefault(i, opening)
        for think in thinks:
            if think > 0:
                await task.deferLater(reactor, think, lambda: None)
            turn = sum(1 for m in messages if m["role"] == "assistant") + 1
            if turn > 1:
                messages.append({"role": "user", "content": next_message(turn)})
            result = TurnResult(i, turn)
            results.append(result)
            url = target(i, turn)
            reply = await one_turn(reactor, agent, url, workload, messages, host_of, result)
            if reply is None:
                failed.add(i)
                break
            messages.append({"role": "assistant", "content": reply})
        if progress is not None and (last_phase[i] == n or i in failed):
            done = sum(1 for r in results if r.status)
            print(
                f"    conversation {i + 1} ended ({done} turns so far)", file=progress, flush=True
            )

    try:
        for n, phase in enumerate(phases):
            gate = defer.DeferredSemaphore(phase.at_once)
            await defer.gatherResults(
                [
                    defer.ensureDeferred(gate.run(conversation, n, i, thinks))
                    for i, thinks in zip(phase.conversations, phase.thinks, strict=True)
                ],
                consumeErrors=True,
            )
            if progress is not None and len(phases) > 1:
                done = sum(1 for r in results if r.status)
                print(f"    {phase.name} done ({done} turns so far)", file=progress, flush=True)
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
    """Send one turn and fill `result`; the reply's text, or None (and `result.error`). A
    streamed turn's seconds run to the stream's end, its `ttft_s` to its first reply text."""
    headers = Headers({b"Content-Type": [b"application/json"]})
    body = BytesProducer(request_body(workload, messages, result.conversation))
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
        if workload.stream:
            streamed = read_stream(reader.chunks, reader.times)
            answer, reply = streamed.answer, streamed.reply
            if streamed.first_content is not None:
                result.ttft_s = streamed.first_content - started
        else:
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
