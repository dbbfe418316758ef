"""The GenAI conventions as crossbar fills them: each client API's operation, the request
parameters worth an attribute, and contents in the conventions' shape, media by type only."""

from __future__ import annotations

import json

from crossbar.tracing import genai


def test_each_inference_path_names_its_operation_and_nothing_else_does():
    assert genai.operation("/v1/chat/completions") == "chat"
    assert genai.operation("/v1/messages") == "chat"
    assert genai.operation("/v1/responses") == "chat"
    assert genai.operation("/completion") == "text_completion"
    assert genai.operation("/v1/embeddings") == "embeddings"
    assert genai.operation("/v1/rerank") == "rerank"
    assert genai.operation("/props") is None
    assert genai.operation("/v1/chat/completions/input_tokens") is None


def test_request_parameters_are_numbers_the_first_output_limit_wins():
    body = {"max_tokens": 64, "n_predict": 9, "temperature": 0.2, "top_p": "high", "stream": True}
    assert genai.request_parameters(body) == {
        "gen_ai.request.max_tokens": 64,
        "gen_ai.request.temperature": 0.2,
        "crossbar.request.stream": True,
    }
    assert genai.request_parameters(["not", "a", "body"]) == {}


def test_input_contents_keep_text_and_name_media_by_type_only():
    body = {
        "system": "Be brief.",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in this picture?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            }
        ],
    }
    found = genai.input_contents(body)
    assert json.loads(found["gen_ai.system_instructions"]) == [
        {"type": "text", "content": "Be brief."}
    ]
    assert json.loads(found["gen_ai.input.messages"]) == [
        {
            "role": "user",
            "parts": [
                {"type": "text", "content": "What is in this picture?"},
                {"type": "image_url"},
            ],
        }
    ]
    assert "AAAA" not in json.dumps(found)
    raw = genai.input_contents({"prompt": "def parse("})
    assert json.loads(raw["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "def parse("}]}
    ]


def _said(found: dict[str, str]) -> str:
    return json.loads(found["gen_ai.output.messages"])[0]["parts"][0]["content"]


def test_output_contents_join_a_streams_deltas_in_each_dialect():
    openai = (
        b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n'
        b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\n'
        b'data: {"choices":[{"delta":{"content":"lo"}}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":3}}\n\ndata: [DONE]\n\n'
    )
    assert _said(genai.output_contents(openai, stream=True)) == "Hello"
    anthropic = (
        b'event: content_block_delta\ndata: {"type":"content_block_delta",'
        b'"delta":{"type":"text_delta","text":"Hi"}}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"}}\n\n'
    )
    assert _said(genai.output_contents(anthropic, stream=True)) == "Hi"
    cut = b'data: {"choices":[{"delta":{"content":"Par"}}]}\n\ndata: {"choi'
    assert _said(genai.output_contents(cut, stream=True)) == "Par"  # the capture's cut end


def test_output_contents_of_whole_answers():
    chat = {"choices": [{"message": {"role": "assistant", "content": "Done."}}]}
    assert _said(genai.output_contents(json.dumps(chat).encode(), stream=False)) == "Done."
    message = {"content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]}
    assert _said(genai.output_contents(json.dumps(message).encode(), stream=False)) == "AB"
    response = {"output": [{"type": "message", "content": [{"type": "output_text", "text": "R"}]}]}
    assert _said(genai.output_contents(json.dumps(response).encode(), stream=False)) == "R"
    assert genai.output_contents(b"not json", stream=False) == {}
