"""A real llama-server killed mid-stream (SIGKILL) under the official clients: the answer goes
on on the other real server in the same stream, one answer, nothing repeated (issue 50)."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest_twisted
from twisted.internet.threads import deferToThread

from tests.real.dialogue import openai_client
from tests.support.harness import MODEL

REPLY = 300  # tokens: several seconds of generation on this machine's one thread per server
KILL_AFTER = 30  # text events the client reads before its host is killed
ASK = "Write a long story about a lighthouse keeper and the sea."
# Greedy, and all REPLY tokens unless cut (the tiny model would stop early): the same body for
# both APIs, as the official clients send it and as a plain request of the uninterrupted run.
BODY = {"model": MODEL, "messages": [{"role": "user", "content": ASK}], "max_tokens": REPLY}
BODY |= {"temperature": 0, "ignore_eos": True}
SDK = {**{k: v for k, v in BODY.items() if k != "ignore_eos"}, "extra_body": {"ignore_eos": True}}
# Anthropic's client takes no temperature of its own: the body carries it.
ANTHROPIC_SDK = {k: v for k, v in BODY.items() if k in ("model", "messages", "max_tokens")}
ANTHROPIC_SDK["extra_body"] = {"temperature": 0, "ignore_eos": True}


async def home(crossbar: Any, fleet: Any) -> str:
    """The host of the conversation's lease, made by a first short turn."""

    def first() -> str:
        with openai_client(crossbar.url("convo", "/v1")) as client:
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": ASK}], max_tokens=2
            )
            return raw.headers["x-crossbar-host"]

    return await fleet.within(deferToThread(first), 60, "the first turn")


def one_answer(text: str, before: str, whole: str) -> None:
    """`text` begins with what the client had before the kill, does not say it again, and is,
    at temperature 0, the answer an uninterrupted run gives (`whole`): nothing lost, nothing
    repeated. (llama-server continues a prefill greedily as it would have gone on; it does
    not promise so, as it tokenizes the text again, but for this model and prompt it does.)"""
    assert text.startswith(before)
    assert not text[len(before) :].startswith(before[:24])
    assert text == whole


async def uninterrupted(crossbar: Any, fleet: Any, path: str, body: dict[str, Any]) -> Any:
    """The same request answered whole by the surviving host, through crossbar."""
    response = await fleet.within(
        crossbar.client().post(crossbar.url("convo", path), json={**body, "stream": False}),
        60,
        "the uninterrupted answer",
    )
    return await response.json()


@pytest_twisted.ensureDeferred
async def test_the_openai_client_gets_one_whole_answer_when_its_host_is_killed(launch):
    crossbar, fleet = await launch()
    host = await home(crossbar, fleet)
    llama = fleet.llamas[host]

    def run() -> tuple[str, str, Any, list[Any]]:
        chunks: list[Any] = []
        before = ""
        with openai_client(crossbar.url("convo", "/v1")) as client:
            stream = client.chat.completions.create(
                **SDK, stream=True, stream_options={"include_usage": True}
            )
            texts = 0
            for chunk in stream:
                chunks.append(chunk)
                if chunk.choices and chunk.choices[0].delta.content:
                    texts += 1
                    if texts == KILL_AFTER:
                        before = "".join(
                            c.choices[0].delta.content or "" for c in chunks if c.choices
                        )
                        llama.kill()  # SIGKILL mid-answer
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, before, chunks[-1].usage, chunks

    text, before, usage, chunks = await fleet.within(deferToThread(run), 120, "the answer")
    assert before, "the host was never killed"
    whole = await uninterrupted(crossbar, fleet, "/v1/chat/completions", BODY)
    one_answer(text, before, whole["choices"][0]["message"]["content"])
    # One answer's id and model throughout (llama-server's own `created` moves on each second).
    assert len({(c.id, c.model) for c in chunks}) == 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert usage.completion_tokens == REPLY  # both servers' tokens
    assert usage.model_extra["crossbar_resumed"] == 1
    assert [k[2] for k in crossbar.parts.usage.resumes] == ["resumed"]


@pytest_twisted.ensureDeferred
async def test_the_anthropic_client_gets_one_whole_answer_when_its_host_is_killed(launch):
    crossbar, fleet = await launch()
    host = await home(crossbar, fleet)
    llama = fleet.llamas[host]

    def run() -> tuple[str, str, Any]:
        client = anthropic.Anthropic(
            base_url=crossbar.url("convo", ""), api_key="none", max_retries=0, timeout=60
        )
        pieces: list[str] = []
        before = ""
        with client.messages.stream(**ANTHROPIC_SDK) as stream:
            for piece in stream.text_stream:
                pieces.append(piece)
                if len(pieces) == KILL_AFTER:
                    before = "".join(pieces)
                    llama.kill()
            message = stream.get_final_message()
        return "".join(pieces), before, message

    text, before, message = await fleet.within(deferToThread(run), 120, "the answer")
    assert before, "the host was never killed"
    whole = await uninterrupted(crossbar, fleet, "/v1/messages", BODY)
    one_answer(text, before, whole["content"][0]["text"])
    assert message.stop_reason == "max_tokens"
    assert message.content[0].text == text
    assert message.usage.output_tokens == REPLY  # both servers' tokens
    assert [k[2] for k in crossbar.parts.usage.resumes] == ["resumed"]
