"""Usage is read and recorded for every streamed dialect, as llama-server streams it.

Each dialect keeps its counts in its own place (checked against llama.cpp's server-task.cpp):
OpenAI chat in the finish chunk's `timings` (and a last `usage` chunk only when
`stream_options.include_usage` asks), completions and llama.cpp's `/completion` in the last
chunk, Responses in `response.completed`, Anthropic in `message_start` (prompt and cache reads)
plus `message_delta` (output). Turn two of each conversation reads its prefix from the cache,
and the row must say so exactly as the host counted it.
"""

import json

import pytest
import pytest_twisted

from tests.support.harness import MODEL, start_fakes, until, wait

OPENING = "You review parsers carefully and answer in short sentences. " * 4


def chat(turn: int, usage_chunk: bool) -> tuple[str, dict]:
    messages = [{"role": "system", "content": OPENING}, {"role": "user", "content": "Go."}]
    messages += [{"role": "user", "content": f"turn {n}"} for n in range(turn)]
    extra = {"stream_options": {"include_usage": True}} if usage_chunk else {}
    return "/v1/chat/completions", {"messages": messages, **extra}


def completions(turn: int) -> tuple[str, dict]:
    return "/v1/completions", {"prompt": OPENING + " more" * turn}


def native(turn: int) -> tuple[str, dict]:
    return "/completion", {"prompt": OPENING + " more" * turn}


def anthropic(turn: int) -> tuple[str, dict]:
    messages = [{"role": "user", "content": "Go."}]
    for n in range(turn):
        messages += [
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": f"turn {n}"},
        ]
    return "/v1/messages", {"system": OPENING, "messages": messages, "max_tokens": 8}


def responses(turn: int) -> tuple[str, dict]:
    # The whole input again each turn, as Codex sends it (llama-server keeps no responses).
    return "/v1/responses", {"instructions": "Be brief.", "input": OPENING + " more" * turn}


DIALECTS = {
    "chat": lambda turn: chat(turn, usage_chunk=False),
    "chat+include_usage": lambda turn: chat(turn, usage_chunk=True),
    "completions": completions,
    "native": native,
    "anthropic": anthropic,
    "responses": responses,
}


async def stream(crossbar, path: str, body: dict) -> bytes:
    body = {"model": MODEL, "stream": True, **body}
    response = await wait(
        crossbar.client().post(crossbar.url("convo", path), data=json.dumps(body).encode())
    )
    raw = await wait(response.content())
    assert response.code == 200, raw
    return raw


async def two_turns(dialect: str, crossbar) -> None:
    for turn in (0, 1):
        await stream(crossbar, *DIALECTS[dialect](turn))


@pytest.mark.parametrize("dialect", list(DIALECTS))
@pytest_twisted.ensureDeferred
async def test_a_streamed_answer_records_the_hosts_own_token_counts(dialect, launch):
    fakes = await start_fakes("titan", reply_tokens=6)
    crossbar = await launch(fakes, {"convo": {"hosts": ["titan"]}})
    rows = []
    crossbar.parts.usage.observers.append(rows.append)
    await two_turns(dialect, crossbar)
    await until(lambda: len(rows) == 2)
    done = fakes["titan"].counters.completions
    recorded = [(r.prompt_tokens, r.cached_tokens, r.completion_tokens) for r in rows]
    hosts = [(d.prompt_tokens, d.cache_n, d.completion_tokens) for d in done]
    assert recorded == hosts
    assert all(r.stream and r.status == 200 and r.error == "" for r in rows)
    assert done[1].cache_n > 0  # turn two read its prefix from the cache, and says so
