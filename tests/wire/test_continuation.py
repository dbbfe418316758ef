"""The rules of continuing a cut answer, told on bytes (wire/continuation.py): what a stream had
sent, what cannot be continued, the request that goes on, and the splice that strips exactly the
echo and keeps the client's ids."""

from __future__ import annotations

import json
from typing import Any

import pytest

from crossbar.wire.continuation import (
    Before,
    Family,
    NotContinued,
    Splice,
    Transcript,
    continuation_body,
    refusal,
)
from crossbar.wire.dialects import ANTHROPIC, OPENAI_CHAT, OPENAI_COMPLETIONS, RESPONSES


def chat_event(content: str | None = None, role: str | None = None, **extra: Any) -> bytes:
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    choice = {"index": 0, "delta": delta, "finish_reason": extra.pop("finish", None)}
    chunk = {"id": extra.pop("id", "chatcmpl-1"), "created": extra.pop("created", 100)}
    chunk |= {"model": extra.pop("model", "m"), "choices": [choice], **extra}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def events(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in data.split(b"\n") if line.startswith(b"data: {")]


def told(family: Family, *chunks: bytes) -> Transcript:
    t = Transcript(family)
    for chunk in chunks:
        t.feed(chunk)
    return t


def test_a_transcript_holds_the_text_the_client_has_and_the_ids_it_saw():
    stream = chat_event(role="assistant") + chat_event("Once") + chat_event(" upon")
    t = told(Family.CHAT, stream[:30], stream[30:])  # split anywhere: events are whole
    assert (t.text, t.pieces, t.id, t.created, t.model) == ("Once upon", 2, "chatcmpl-1", 100, "m")
    assert t.why_not() == ""


@pytest.mark.parametrize(
    ("chunk", "why"),
    [
        (chat_event(tool_calls=None) + chat_event(None, finish="stop"), "finished"),
        (b"data: [DONE]\n\n", "finished"),
    ],
)
def test_past_its_own_end_an_answer_has_nothing_left_to_continue(chunk, why):
    assert told(Family.CHAT, chat_event("Hi"), chunk).why_not() == why


def delta_event(**delta: Any) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]}).encode() + b"\n\n"


def test_a_cut_inside_a_tool_call_or_reasoning_cannot_be_continued():
    call = {"index": 0, "id": "c1", "function": {"name": "read", "arguments": '{"pa'}}
    assert told(Family.CHAT, delta_event(tool_calls=[call])).why_not() == "tool_call"
    assert told(Family.CHAT, delta_event(reasoning_content="Let me")).why_not() == "reasoning"


@pytest.mark.parametrize(
    ("dialect", "path", "body", "why"),
    [
        (OPENAI_CHAT, "/v1/chat/completions", {"messages": [], "n": 2}, "n"),
        (
            OPENAI_CHAT,
            "/v1/chat/completions",
            {"response_format": {"type": "json_object"}},
            "structured",
        ),
        (OPENAI_CHAT, "/v1/chat/completions", {"response_format": {"type": "text"}}, ""),
        (OPENAI_CHAT, "/v1/chat/completions", {"grammar": "root ::= x"}, "structured"),
        (ANTHROPIC, "/v1/messages", {"output_format": {"type": "json_schema"}}, "structured"),
        (OPENAI_COMPLETIONS, "/v1/completions", {"prompt": [1, 2, 3]}, "prompt"),
        (OPENAI_COMPLETIONS, "/v1/completions", {"prompt": "Once"}, ""),
        (RESPONSES, "/v1/responses", {"input": "hi"}, "dialect"),
    ],
)
def test_what_a_request_asks_can_keep_its_answer_from_ever_being_continued(
    dialect, path, body, why
):
    assert refusal(dialect, path, body) == why


def test_the_continuation_asks_for_the_rest_of_the_limit_after_the_text_as_assistant():
    body = {"messages": [{"role": "user", "content": "Tell"}], "max_tokens": 20, "stream": True}
    out = continuation_body(Family.CHAT, body, "Once upon a ", 3)
    assert out["messages"][-1] == {"role": "assistant", "content": "Once upon a"}  # trimmed
    assert out["max_tokens"] == 17
    assert body["max_tokens"] == 20 and len(body["messages"]) == 1  # the client's is untouched
    raw = continuation_body(Family.NATIVE, {"prompt": "Tell: ", "n_predict": 5}, "Once", 5)
    assert (raw["prompt"], raw["n_predict"]) == ("Tell: Once", 1)  # never 0: the host ends it


def splice(before: Transcript, *chunks: bytes) -> tuple[bytes, Splice]:
    out: list[bytes] = []
    s = Splice(before, Before(before.text, before.pieces, 1), out.append)
    for chunk in chunks:
        s.feed(chunk)
    return b"".join(out), s


def test_the_splice_strips_exactly_the_echo_and_keeps_the_clients_ids():
    t = told(Family.CHAT, chat_event(role="assistant"), chat_event("Once"), chat_event(" upon "))
    written, s = splice(
        t,
        chat_event(role="assistant", id="chatcmpl-2", created=200, model="m2"),
        chat_event("Once", id="chatcmpl-2"),
        chat_event(" upon a", id="chatcmpl-2"),  # the echo's end, its trailing space, a token
        chat_event(" time", id="chatcmpl-2", finish="length"),
        b"data: [DONE]\n\n",
    )
    got = events(written)
    assert [e["choices"][0]["delta"] for e in got] == [{"content": "a"}, {"content": " time"}]
    assert {(e["id"], e["created"], e["model"]) for e in got} == {("chatcmpl-1", 100, "m")}
    assert written.endswith(b"data: [DONE]\n\n")
    assert t.text == "Once upon a time"  # the client's view goes on with it
    s.finish()


def test_nothing_is_written_until_the_echo_is_whole_and_a_new_answer_writes_nothing():
    t = told(Family.CHAT, chat_event("Once upon"))
    written, s = splice(t, chat_event("Once"))
    assert written == b"" and not s.confirmed
    with pytest.raises(NotContinued):
        splice(told(Family.CHAT, chat_event("Once upon")), chat_event("Hello"))
    with pytest.raises(NotContinued):
        s.finish()  # it ended before the text it was given came back


def test_the_final_usage_counts_both_hosts_output_and_says_the_answer_moved():
    t = told(Family.CHAT, chat_event("a"), chat_event(" b"), chat_event(" c"))
    usage = {"prompt_tokens": 13, "completion_tokens": 7, "total_tokens": 20}
    final = b"data: " + json.dumps({"id": "x", "choices": [], "usage": usage}).encode() + b"\n\n"
    written, _ = splice(t, chat_event("a b c d"), final)
    (_, last) = events(written)
    assert last["usage"] == {
        "prompt_tokens": 10,  # the given text is output, not prompt
        "completion_tokens": 10,
        "total_tokens": 20,
        "crossbar_resumed": 1,
    }


def anthropic(kind: str, **data: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


def test_an_anthropic_continuation_goes_on_in_the_open_text_block():
    t = told(
        Family.ANTHROPIC,
        anthropic("message_start", message={"id": "msg_1", "model": "m", "usage": {}}),
        anthropic("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        anthropic("content_block_delta", index=0, delta={"type": "text_delta", "text": "The sea"}),
    )
    assert (t.text, t.open_block, t.why_not()) == ("The sea", 0, "")
    written, _ = splice(
        t,
        anthropic("message_start", message={"id": "msg_2", "model": "m", "usage": {}}),
        anthropic("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        anthropic(
            "content_block_delta", index=0, delta={"type": "text_delta", "text": "The sea is"}
        ),
        anthropic("content_block_stop", index=0),
        anthropic("message_delta", delta={"stop_reason": "max_tokens"}, usage={"output_tokens": 4}),
        anthropic("message_stop"),
    )
    kinds = [line[7:] for line in written.split(b"\n") if line.startswith(b"event: ")]
    assert kinds == [
        b"content_block_delta",
        b"content_block_stop",
        b"message_delta",
        b"message_stop",
    ]
    delta, _, usage, _ = events(written)
    assert delta["delta"]["text"] == " is"
    assert usage["usage"] == {"output_tokens": 5, "crossbar_resumed": 1}
