"""What request bodies say, shape by shape: conversation openings and prompt text.

The dialects (dialects.py) pick among these per API; the fingerprint hashes an opening, the
context guard weighs prompt text. Text parts of a content array count by
their text; images and audio by a hash of their data (so a new upload is a new conversation).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

Message = dict[str, Any]
_LEADING_ROLES = ("system", "developer")
_PROMPT_KEYS = ("system", "instructions", "prompt", "input_prefix", "input_suffix", "input")


def canonical(value: Any) -> str:
    """JSON with sorted keys and no spaces: the same value always gives the same text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _media_hash(value: Any) -> str:
    return hashlib.sha256(canonical(value).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _part(part: Any) -> Any:
    """One content part: text by its text, media by a hash of its data."""
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return canonical(part)
    kind = part.get("type", "")
    if "text" in part and isinstance(part["text"], str):
        return part["text"]
    for key in ("image_url", "input_audio", "source", "file", "image", "audio", "data"):
        if key in part:
            return {"media": kind or key, "hash": _media_hash(part[key])}
    return {"part": kind, "hash": _media_hash(part)}


def _content(content: Any) -> list[Any]:
    if content is None:
        return []
    if isinstance(content, list):
        return [_part(p) for p in content]
    return [_part(content)]


def _message(message: Any) -> Message | None:
    if not isinstance(message, dict):
        return None
    return {"role": message.get("role", "user"), "content": _content(message.get("content"))}


def _opening(messages: list[Any]) -> list[Message]:
    """The leading system/developer messages plus the first user message."""
    out: list[Message] = []
    normal = [m for m in (_message(x) for x in messages) if m is not None]
    i = 0
    while i < len(normal) and normal[i]["role"] in _LEADING_ROLES:
        out.append(normal[i])
        i += 1
    for m in normal[i:]:
        if m["role"] == "user":
            out.append(m)
            break
    return out


def chat_opening(body: dict[str, Any]) -> list[Message] | None:
    """`messages` (OpenAI chat, llama.cpp's apply-template), with Anthropic's top-level
    `system` in front when there is one; None when the body has no `messages`."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    head: list[Any] = []
    if body.get("system") is not None:
        head.append({"role": "system", "content": body["system"]})
    return _opening(head + messages)


def responses_opening(body: dict[str, Any]) -> list[Message] | None:
    """OpenAI Responses: `instructions` as the system message, then `input` (a string is one
    user message)."""
    if "input" not in body and "instructions" not in body:
        return None
    head: list[Any] = []
    if isinstance(body.get("instructions"), str):
        head.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    elif not isinstance(items, list):
        items = []
    return _opening(head + items)


def no_opening(body: dict[str, Any]) -> list[Message] | None:
    """For APIs that carry no conversation."""
    return None


def raw_prompt(body: dict[str, Any]) -> str | None:
    """The raw prompt of completion-style bodies (`prompt`, else `input_prefix`)."""
    for key in ("prompt", "input_prefix"):
        value = body.get(key)
        if value is not None:
            return value if isinstance(value, str) else canonical(value)
    return None


def no_prompt(body: dict[str, Any]) -> str | None:
    """For APIs whose prompt does not identify a conversation (embeddings, rerank)."""
    return None


def _text_length(value: Any) -> int:
    """Characters of text in a content value: strings, lists of parts, `text` or `content` of
    objects; anything else counts nothing. Iterative: a deeply nested body cannot exhaust the
    stack."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            text = item.get("text")
            if isinstance(text, str):
                total += len(text)
            else:
                stack.append(item.get("content"))
    return total


def prompt_chars(body: Any) -> int:
    """Characters of prompt text in a request body (messages, system, input, prompt...)."""
    if not isinstance(body, dict):
        return 0
    total = sum(_text_length(body.get(key)) for key in _PROMPT_KEYS)
    messages = body.get("messages")
    if isinstance(messages, list):
        total += sum(_text_length(m) + 8 for m in messages)  # + role markers of the template
    tools = body.get("tools")
    if tools:
        try:
            total += len(json.dumps(tools))
        except (TypeError, ValueError, RecursionError):
            pass  # a schema too odd to measure counts nothing; the host will say
    return total


def limit_output(
    body: Any, fields: tuple[str, ...], default: int | None, cap: int | None
) -> dict[str, Any] | None:
    """`body` with its output limit set where the route sets one, or None when nothing
    changes. `fields` are the dialect's limit fields, the one it sets first: when the request
    sets none of them (or only a negative or null one: unlimited, to llama-server), the first
    gets `default` (else `cap`); every one above `cap` is brought down to it."""
    if not isinstance(body, dict) or not fields or (default is None and cap is None):
        return None
    out = None
    given = [f for f in fields if isinstance(body.get(f), int) and not isinstance(body[f], bool)]
    limited = [f for f in given if body[f] >= 0]
    if not limited:
        wanted = default if default is not None else cap
        out = {**body, fields[0]: wanted}
        for f in given:  # n_predict = -1 and the like: unlimited, which the route is not
            out[f] = wanted
        return out
    if cap is not None:
        for f in limited:
            if body[f] > cap:
                out = out or dict(body)
                out[f] = cap
    return out
