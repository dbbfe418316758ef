"""The OpenTelemetry GenAI semantic conventions as crossbar uses them: the operation a client API
performs, the request parameters worth a span attribute, and message contents in the
conventions' shape (recorded only on routes with `record_content`). Pure: no OpenTelemetry
import, so the metrics can use it with the extra absent.
"""

from __future__ import annotations

import json
from typing import Any

# gen_ai.operation.name per llama-server path: the conventions' well-known values, and
# "rerank" where they have none.
_OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/chat/completions": "chat",
    "/v1/messages": "chat",
    "/v1/responses": "chat",
    "/v1/completions": "text_completion",
    "/completions": "text_completion",
    "/completion": "text_completion",
    "/infill": "text_completion",
    "/v1/embeddings": "embeddings",
    "/embedding": "embeddings",
    "/embeddings": "embeddings",
    "/v1/rerank": "rerank",
    "/reranking": "rerank",
}
PROVIDER = "llama.cpp"  # gen_ai.provider.name: no well-known value names llama-server
# Request parameters copied to gen_ai.request.* when they are numbers.
_PARAMETERS = {
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "max_output_tokens": "gen_ai.request.max_tokens",
    "n_predict": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "seed": "gen_ai.request.seed",
}
CONTENT_KEEP = 64 * 1024  # characters of contents kept per attribute; the rest is cut


def operation(path: str) -> str | None:
    """The GenAI operation of an inference path, None for any other path."""
    return _OPERATIONS.get(path)


def request_parameters(body: Any) -> dict[str, Any]:
    """The gen_ai.request.* attributes a request body sets (numbers only, the first of each)."""
    found: dict[str, Any] = {}
    if not isinstance(body, dict):
        return found
    for key, name in _PARAMETERS.items():
        value = body.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            found.setdefault(name, value)
    if isinstance(body.get("stream"), bool):
        found["crossbar.request.stream"] = body["stream"]
    return found


def _parts(content: Any) -> list[dict[str, Any]]:
    """A message's content as the conventions' parts: text kept, anything else by its type."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append({"type": "text", "content": part})
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append({"type": "text", "content": part["text"]})
            elif isinstance(part, dict):
                out.append({"type": str(part.get("type", "unknown"))})  # media: never its data
        return out
    return [{"type": "text", "content": json.dumps(content)}]


def _capped(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= CONTENT_KEEP else text[:CONTENT_KEEP]


def input_contents(body: Any) -> dict[str, str]:
    """gen_ai.system_instructions and gen_ai.input.messages of a request body (JSON text)."""
    if not isinstance(body, dict):
        return {}
    found: dict[str, str] = {}
    system = body.get("system", body.get("instructions"))
    if system is not None:
        found["gen_ai.system_instructions"] = _capped(_parts(system))
    messages = body.get("messages")
    if messages is None and isinstance(body.get("input"), list):
        messages = body["input"]  # the Responses API
    if isinstance(messages, list):
        shaped = [
            {"role": str(m.get("role", "user")), "parts": _parts(m.get("content"))}
            for m in messages
            if isinstance(m, dict)
        ]
        found["gen_ai.input.messages"] = _capped(shaped)
    else:
        prompt = body.get("prompt", body.get("input"))
        if prompt is not None:
            found["gen_ai.input.messages"] = _capped([{"role": "user", "parts": _parts(prompt)}])
    return found


def _answer_text(obj: Any) -> str | None:
    """The text one answer object (a JSON body, or one SSE event's data) adds."""
    if not isinstance(obj, dict):
        return None
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        first = choices[0]
        for holder in (first.get("delta"), first.get("message")):
            if isinstance(holder, dict) and isinstance(holder.get("content"), str):
                return holder["content"]
        if isinstance(first.get("text"), str):
            return first["text"]
        return None
    delta = obj.get("delta")
    if isinstance(delta, dict) and isinstance(delta.get("text"), str):
        return delta["text"]  # Anthropic's content_block_delta
    if obj.get("type") == "response.output_text.delta" and isinstance(delta, str):
        return delta  # the Responses API's stream
    output = obj.get("output")
    if isinstance(output, list):  # the Responses API's whole answer
        return "".join(
            part.get("text", "")
            for item in output
            if isinstance(item, dict) and isinstance(item.get("content"), list)
            for part in item["content"]
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    content = obj.get("content")
    if isinstance(content, str):
        return content  # llama.cpp's /completion
    if isinstance(content, list):  # Anthropic's whole message
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return None


def output_contents(answer: bytes, stream: bool) -> dict[str, str]:
    """gen_ai.output.messages of a captured answer (its first CONTENT_KEEP bytes)."""
    text = answer.decode("utf-8", "replace")
    pieces: list[str] = []
    if stream:
        for line in text.splitlines():
            if line.startswith("data:"):
                data = line[5:].strip()
                if data and data != "[DONE]":
                    try:
                        piece = _answer_text(json.loads(data))
                    except ValueError:
                        continue  # the cut last line of the capture
                    if piece:
                        pieces.append(piece)
    else:
        try:
            piece = _answer_text(json.loads(text))
        except ValueError:
            piece = None
        if piece:
            pieces.append(piece)
    if not pieces:
        return {}
    message = [{"role": "assistant", "parts": [{"type": "text", "content": "".join(pieces)}]}]
    return {"gen_ai.output.messages": _capped(message)}
