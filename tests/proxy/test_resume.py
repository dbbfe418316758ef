"""Answers that survive their host (issue 50): a stream its host cuts goes on on another host
in the same client stream, with nothing lost or repeated; what cannot be continued ends as a
cut stream always did, and says why; an answer that showed the client nothing runs again."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest
import pytest_twisted
from twisted.internet.threads import deferToThread

from crossbar.leases import Key
from tests.support.harness import MODEL, Crossbar, start_crossbar, start_fakes, wait

_ROWS: dict[int, list[Any]] = {}
STORY = [{"role": "user", "content": "Tell me a long story about the proxy."}]


def routes(**extra: Any) -> dict[str, Any]:
    return {"convo": {"hosts": ["titan", "atlas"], "default_model": MODEL, **extra}}


async def fleet(route: dict[str, Any] | None = None, server: dict | None = None, **knobs):
    fakes = await start_fakes("titan", "atlas", **knobs)
    crossbar = await start_crossbar(fakes, routes(**(route or {})), server=server)
    seen = _ROWS[id(crossbar)] = []
    crossbar.parts.usage.observers.append(seen.append)
    return crossbar


def rows(crossbar: Crossbar) -> list[Any]:
    """The usage rows of the requests crossbar finished, in order."""
    return _ROWS[id(crossbar)]


async def home(crossbar: Crossbar, messages: list[dict] = STORY) -> tuple[str, str]:
    """The host the conversation's lease is on (a first short turn makes it), and the other."""
    response, _ = await crossbar.chat("convo", messages, max_tokens=2)
    host = response.headers.getRawHeaders(b"x-crossbar-host")[0].decode()
    return host, ("atlas" if host == "titan" else "titan")


def client(crossbar: Crossbar) -> openai.OpenAI:
    return openai.OpenAI(base_url=crossbar.url("convo", "/v1"), api_key="x", max_retries=0)


async def streamed(crossbar: Crossbar, **extra: Any) -> tuple[list[Any], Exception | None]:
    """The chunks the official client read of one streamed answer, and the error it ended
    with (None when it ended as a stream should)."""

    def run() -> tuple[list[Any], Exception | None]:
        chunks: list[Any] = []
        body = {"model": MODEL, "messages": STORY, "max_tokens": 20, **extra}
        try:
            for chunk in client(crossbar).chat.completions.create(stream=True, **body):
                chunks.append(chunk)
        except openai.APIError as e:
            return chunks, e
        return chunks, None

    return await wait(deferToThread(run), 60)


def text_of(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def sent_by(fake: Any) -> str:
    """What a fake's last answer generated (the text of a cut one: what it sent, and the one
    token it made before the cut)."""
    return fake.counters.completions[-1].text


def resumes(crossbar: Crossbar) -> dict[tuple[str, str, str], int]:
    """crossbar_resumes_total as /metrics shows it: (route, reason, outcome) -> count."""
    out = {}
    for line in crossbar.parts.metrics.render().decode().splitlines():
        if line.startswith("crossbar_resumes_total{"):
            labels = dict(
                part.split("=", 1)
                for part in line[line.index("{") + 1 : line.index("}")].split(",")
            )
            key = tuple(labels[k].strip('"') for k in ("route", "reason", "outcome"))
            out[key] = int(float(line.rsplit(" ", 1)[1]))
    return out


@pytest_twisted.ensureDeferred
async def test_a_stream_its_host_closes_goes_on_on_the_other_host_as_one_answer():
    crossbar = await fleet()
    try:
        cut, other = await home(crossbar)
        crossbar.fakes[cut].faults.drop_after_chunks = 6  # the role delta and five tokens
        chunks, error = await streamed(crossbar, stream_options={"include_usage": True})
        assert error is None
        text = text_of(chunks)
        # The first host's five tokens, then the other host's: the answer the first host would
        # have given uncut, nothing lost, nothing twice.
        assert text == crossbar.fakes[other].reply(STORY, max_tokens=20)
        assert text.endswith(sent_by(crossbar.fakes[other]))
        assert len({(c.id, c.created, c.model) for c in chunks}) == 1  # one answer
        roles = [c for c in chunks if c.choices and c.choices[0].delta.role]
        assert len(roles) == 1
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        usage = chunks[-1].usage
        assert usage.completion_tokens == 20  # both hosts' tokens: the request's limit
        assert usage.model_extra["crossbar_resumed"] == 1
        row = rows(crossbar)[-1]
        assert (row.host, row.resumed, row.completion_tokens, row.error) == (other, 1, 20, "")
        assert resumes(crossbar) == {("convo", "closed", "resumed"): 1}
        lease = crossbar.parts.table.lease(Key("convo", row.fp, MODEL))
        assert lease.host == other  # the conversation stays where its answer went on
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_host_that_goes_silent_mid_stream_is_left_after_the_read_timeout():
    crossbar = await fleet(server={"upstream_idle_timeout": "0.3s"})
    try:
        cut, other = await home(crossbar)
        crossbar.fakes[cut].faults.stall_after_chunks = 4
        chunks, error = await streamed(crossbar)
        assert error is None
        assert text_of(chunks).endswith(sent_by(crossbar.fakes[other]))
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        assert resumes(crossbar) == {("convo", "idle_timeout", "resumed"): 1}
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_stream_its_host_resets_goes_on_too():
    crossbar = await fleet()
    try:
        cut, other = await home(crossbar)
        crossbar.fakes[cut].faults.reset_after_chunks = 5
        chunks, error = await streamed(crossbar)
        assert error is None
        assert text_of(chunks) == crossbar.fakes[other].reply(STORY, max_tokens=20)
        assert resumes(crossbar) == {("convo", "reset", "resumed"): 1}
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_route_of_one_host_continues_on_that_host_once_it_answers_again():
    fakes = await start_fakes("titan")
    crossbar = await start_crossbar(fakes, {"convo": {"hosts": ["titan"], "default_model": MODEL}})
    try:
        fakes["titan"].faults.drop_after_chunks = 6
        fakes["titan"].faults.cut_once = True  # a restart: the next request is answered
        chunks, error = await streamed(crossbar)
        assert error is None
        assert text_of(chunks) == fakes["titan"].reply(STORY, max_tokens=20)
        # The continuation found the text it was given in the host's cache: one token to read.
        assert fakes["titan"].counters.completions[-1].prompt_n == 1
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_an_anthropic_stream_its_host_cuts_goes_on_in_its_open_text_block():
    crossbar = await fleet()
    try:
        cut, other = await home(crossbar)
        crossbar.fakes[cut].faults.drop_after_chunks = 6

        def run() -> tuple[list[str], Any]:
            client = anthropic.Anthropic(
                base_url=crossbar.url("convo", ""), api_key="x", max_retries=0
            )
            with client.messages.stream(model=MODEL, max_tokens=20, messages=STORY) as stream:
                kinds = [event.type for event in stream]
                message = stream.get_final_message()
            return kinds, message

        kinds, message = await wait(deferToThread(run), 60)
        assert kinds.count("message_start") == 1 and kinds.count("content_block_start") == 1
        assert kinds[-1] == "message_stop"
        assert message.content[0].text == crossbar.fakes[other].reply(STORY, max_tokens=20)
        assert (message.stop_reason, message.usage.output_tokens) == ("max_tokens", 20)
        assert resumes(crossbar) == {("convo", "closed", "resumed"): 1}
    finally:
        await crossbar.stop()


async def complete(crossbar: Crossbar, **body: Any) -> tuple[Any, bytes]:
    body = {"model": MODEL, "prompt": "Once upon a time, the proxy", **body}
    response = await crossbar.client().post(
        crossbar.url("convo", "/v1/completions"), data=json.dumps(body).encode()
    )
    return response, await response.content()


@pytest_twisted.ensureDeferred
async def test_a_raw_completion_goes_on_from_its_prompt_and_the_text_so_far():
    crossbar = await fleet()
    try:
        first, _ = await complete(crossbar, max_tokens=2)  # its prompt's lease
        cut = first.headers.getRawHeaders(b"x-crossbar-host")[0].decode()
        other = crossbar.fakes["atlas" if cut == "titan" else "titan"]
        crossbar.fakes[cut].faults.drop_after_chunks = 6
        _, answer = await complete(crossbar, max_tokens=20, stream=True)
        events = [json.loads(x[6:]) for x in answer.split(b"\n") if x.startswith(b"data: {")]
        text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
        # The first host's six tokens, then the other's answer to the prompt and that text:
        # no echo to strip, nothing twice, one answer.
        sent = text.removesuffix(sent_by(other))
        assert sent and sent_by(crossbar.fakes[cut]).startswith(sent)
        assert (
            other.reply(prompt="Once upon a time, the proxy" + sent, max_tokens=14)
            == (text[len(sent) :])
        )
        assert len({e["id"] for e in events}) == 1
        assert events[-1]["choices"][0]["finish_reason"] == "length"
        assert resumes(crossbar) == {("convo", "closed", "resumed"): 1}
    finally:
        await crossbar.stop()


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"response_format": {"type": "json_object"}}, "structured"),
        ({"n": 2}, "n"),
    ],
    ids=["structured", "choices"],
)
@pytest_twisted.ensureDeferred
async def test_what_cannot_be_continued_ends_as_a_cut_stream_and_says_why(extra, reason):
    crossbar = await fleet()
    try:
        cut, _ = await home(crossbar)
        crossbar.fakes[cut].faults.drop_after_chunks = 4
        _, error = await streamed(crossbar, **extra)
        assert isinstance(error, openai.APIError)
        assert "upstream closed mid-response" in str(error)
        assert resumes(crossbar) == {("convo", reason, "refused"): 1}
        assert rows(crossbar)[-1].resumed == 0
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_cut_inside_a_streamed_tool_call_is_not_continued():
    crossbar = await fleet()
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
    ask = [{"role": "user", "content": 'CALL read {"path": "a/very/long/path/to/the/file.py"}'}]
    try:
        cut, _ = await home(crossbar, ask)
        crossbar.fakes[cut].faults.drop_after_chunks = 4
        chunks, error = await streamed(crossbar, messages=ask, tools=tools)
        assert isinstance(error, openai.APIError)
        assert any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
        assert resumes(crossbar) == {("convo", "tool_call", "refused"): 1}
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_resume_attempts_0_keeps_a_cut_stream_cut():
    crossbar = await fleet({"resume_attempts": 0})
    try:
        cut, _ = await home(crossbar)
        crossbar.fakes[cut].faults.drop_after_chunks = 4
        _, error = await streamed(crossbar)
        assert isinstance(error, openai.APIError)
        assert resumes(crossbar) == {("convo", "disabled", "refused"): 1}
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_host_that_would_not_continue_is_found_out_and_never_asked_again():
    crossbar = await fleet()
    try:
        cut, other = await home(crossbar)
        crossbar.fakes[other].config.prefill_assistant = False  # --no-prefill-assistant
        crossbar.fakes[cut].faults.drop_after_chunks = 4
        chunks, error = await streamed(crossbar)
        # The other host answered a new turn: nothing of it reached the client.
        assert isinstance(error, openai.APIError)
        assert sent_by(crossbar.fakes[other]) not in text_of(chunks)
        assert resumes(crossbar) == {("convo", "closed", "failed"): 1}
        # Another conversation on the first host, cut there too: the other host is not asked.
        story = [{"role": "user", "content": "Another story, please."}]
        assert (await home(crossbar, story))[0] == cut
        asked = len(crossbar.fakes[other].counters.completions)
        _, error = await streamed(crossbar, messages=story)
        assert isinstance(error, openai.APIError)
        assert resumes(crossbar)[("convo", "no_prefill", "refused")] == 1
        assert len(crossbar.fakes[other].counters.completions) == asked
    finally:
        await crossbar.stop()


async def whole(crossbar: Crossbar, headers: dict[str, str] | None = None) -> Any:
    body = {"model": MODEL, "messages": STORY, "max_tokens": 12}
    return await crossbar.client().post(
        crossbar.url("convo", "/v1/chat/completions"),
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )


@pytest_twisted.ensureDeferred
async def test_an_answer_that_showed_nothing_runs_again_on_the_other_host():
    crossbar = await fleet()
    try:
        cut, other = await home(crossbar)
        crossbar.fakes[cut].faults.drop_after_chunks = 0  # cut before any byte of its answer
        response = await whole(crossbar)
        answer = json.loads(await response.content())
        assert response.code == 200
        assert response.headers.getRawHeaders(b"x-crossbar-resumed") == [b"1"]
        assert response.headers.getRawHeaders(b"x-crossbar-host") == [other.encode()]
        assert answer["usage"]["completion_tokens"] == 12
        assert rows(crossbar)[-1].resumed == 1
        assert resumes(crossbar) == {("convo", "reset", "resumed"): 1}
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_an_idempotency_key_already_answered_is_not_run_again():
    crossbar = await fleet()
    try:
        cut, _ = await home(crossbar)
        first = await whole(crossbar, {"Idempotency-Key": "order-7"})
        assert first.code == 200
        await first.content()
        crossbar.fakes[cut].faults.drop_after_chunks = 0
        again = await whole(crossbar, {"Idempotency-Key": "order-7"})
        assert again.code == 502
        assert json.loads(await again.content())["error"]["type"] == "api_error"
        fresh = await whole(crossbar, {"Idempotency-Key": "order-8"})
        assert fresh.code == 200
        await fresh.content()
        assert resumes(crossbar) == {
            ("convo", "idempotency_key", "refused"): 1,
            ("convo", "reset", "resumed"): 1,
        }
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_resume_attempts_0_answers_a_failed_whole_answer_with_502():
    crossbar = await fleet({"resume_attempts": 0})
    try:
        cut, _ = await home(crossbar)
        crossbar.fakes[cut].faults.drop_after_chunks = 0
        response = await whole(crossbar)
        assert response.code == 502
        await response.content()
        assert resumes(crossbar) == {("convo", "disabled", "refused"): 1}
    finally:
        await crossbar.stop()
