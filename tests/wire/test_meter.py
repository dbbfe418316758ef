"""Usage and completion ids are read from every dialect's answers as they pass."""

import json

from crossbar.wire.dialects import ANTHROPIC, RESPONSES
from crossbar.wire.meter import Meter


def sse(*events, done=True) -> bytes:
    out = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return out + (b"data: [DONE]\n\n" if done else b"")


def fed(meter: Meter, data: bytes, size: int = 7) -> Meter:
    for i in range(0, len(data), size):  # arbitrary cuts: lines arrive in pieces
        meter.feed(data[i : i + size])
    return meter


def test_an_openai_json_body_gives_usage_with_its_cached_part_and_the_id():
    body = {
        "id": "chatcmpl-1",
        "usage": {
            "prompt_tokens": 40,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 30},
        },
    }
    meter = fed(Meter(stream=False), json.dumps(body).encode())
    meter.finish()
    assert (meter.tokens.prompt, meter.tokens.cached, meter.tokens.completion) == (40, 30, 5)
    assert meter.id == "chatcmpl-1"


def test_llama_timings_count_the_prompt_as_cached_plus_processed():
    body = {"id": "c", "timings": {"cache_n": 100, "prompt_n": 7, "predicted_n": 12}}
    meter = fed(Meter(stream=False), json.dumps(body).encode())
    meter.finish()
    assert (meter.tokens.prompt, meter.tokens.cached, meter.tokens.completion) == (107, 100, 12)


def test_an_openai_stream_takes_the_first_id_and_the_last_chunks_usage():
    chunks = [{"id": "chatcmpl-9", "choices": [{"delta": {"content": w}}]} for w in "abc"]
    chunks.append(
        {"id": "chatcmpl-9", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}}
    )
    meter = fed(Meter(stream=True), sse(*chunks))
    meter.finish()
    assert meter.done and meter.id == "chatcmpl-9"
    assert (meter.tokens.prompt, meter.tokens.completion) == (9, 3)


def test_a_cut_stream_counts_the_events_that_reached_the_client():
    chunks = [{"id": "x", "choices": [{"delta": {"content": "t"}}]}] * 4
    meter = fed(Meter(stream=True), sse(*chunks, done=False))
    meter.delivered()
    assert not meter.done
    assert meter.tokens.completion == 4


def test_a_responses_stream_reads_the_response_id_and_its_usage():
    events = [
        {"type": "response.created", "response": {"id": "resp_1"}},
        {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "hi"},
        {
            "type": "response.completed",
            "response": {
                "id": "resp_1",
                "usage": {
                    "input_tokens": 20,
                    "output_tokens": 2,
                    "input_tokens_details": {"cached_tokens": 15},
                },
            },
        },
    ]
    heard: list[str] = []
    meter = fed(RESPONSES.meter(True, on_id=heard.append), sse(*events, done=False))
    meter.finish()
    assert meter.done and meter.id == "resp_1"
    assert heard == ["resp_1"]  # told once, though two events carry it
    assert (meter.tokens.prompt, meter.tokens.cached, meter.tokens.completion) == (20, 15, 2)


def test_anthropic_usage_adds_cache_reads_to_the_input_tokens():
    start = {
        "type": "message_start",
        "message": {"id": "msg_1", "usage": {"input_tokens": 5, "cache_read_input_tokens": 37}},
    }
    delta = {"type": "message_delta", "usage": {"output_tokens": 8}}
    data = b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + json.dumps(e).encode() + b"\n\n"
        for e in (start, delta, {"type": "message_stop"})
    )
    heard: list[str] = []
    meter = fed(ANTHROPIC.meter(True, on_id=heard.append), data)
    meter.finish()
    assert meter.id == "msg_1" and heard == ["msg_1"]
    assert (meter.tokens.prompt, meter.tokens.cached, meter.tokens.completion) == (42, 37, 8)


def test_a_json_body_too_large_to_keep_is_relayed_without_usage():
    meter = Meter(stream=False)
    meter.feed(b"{" + b" " * (9 * 1024 * 1024))
    meter.feed(b'"usage": {"prompt_tokens": 1}}')
    meter.finish()
    assert (meter.tokens.prompt, meter.id) == (0, None)


def test_a_large_json_body_gives_its_usage_without_being_parsed_whole():
    body = {
        "object": "list",
        "data": [{"embedding": [0.25] * 1024, "index": i} for i in range(100)],
        "usage": {"prompt_tokens": 5000, "prompt_tokens_details": {"cached_tokens": 10}},
        "timings": {"cache_n": 10, "prompt_n": 4990, "predicted_n": 0},
    }
    raw = json.dumps(body).encode()
    assert len(raw) > 256 * 1024
    meter = fed(Meter(stream=False), raw, size=65536)
    meter.finish()
    assert (meter.tokens.prompt, meter.tokens.cached, meter.tokens.completion) == (5000, 10, 0)


def test_a_stream_in_crlf_lines_counts_its_events_and_sees_its_end():
    chunks = [{"id": "x", "choices": [{"delta": {"content": "t"}}]}] * 3
    data = sse(*chunks).replace(b"\n", b"\r\n")
    for size in (7, len(data)):  # cut anywhere, and whole events in one read
        meter = fed(Meter(stream=True), data, size)
        meter.finish()
        assert meter.done and meter.id == "x"
        assert meter.tokens.completion == 3  # no usage sent: the events are the output
