"""Conversation fingerprints (SPEC §6): what keeps turn 1 and turn 40 on the same host."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

# Session ids clients already send, in the order they are trusted.
SESSION_HEADERS = (
    "X-Crossbar-Conversation",
    "X-Session-Id",
    "X-Claude-Code-Session-Id",
    "X-Session-Affinity",
    "Session-Id",
    "Session_Id",
)
_LEADING_ROLES = ("system", "developer")


def _digest(kind: str, data: str | bytes) -> str:
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    return hashlib.sha256(kind.encode() + b"\0" + raw).hexdigest()[:16]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _media_hash(value: Any) -> str:
    return hashlib.sha256(_canonical(value).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _part(part: Any) -> Any:
    """One content part: text by its text, media by a hash of its data."""
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return _canonical(part)
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


def _message(message: Any) -> dict[str, Any] | None:
    if not isinstance(message, dict):
        return None
    return {"role": message.get("role", "user"), "content": _content(message.get("content"))}


def _opening(messages: list[Any]) -> list[dict[str, Any]]:
    """The leading system/developer messages plus the first user message."""
    out: list[dict[str, Any]] = []
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


def _chat_opening(body: dict[str, Any], path: str) -> list[dict[str, Any]] | None:
    """The opening of a chat-shaped body, or None when the body is not chat-shaped."""
    if isinstance(body.get("messages"), list):
        head: list[Any] = []
        system = body.get("system")  # Anthropic Messages: the system prompt sits outside
        if system is not None:
            head.append({"role": "system", "content": system})
        return _opening(head + body["messages"])
    if path.endswith("/responses") and ("input" in body or "instructions" in body):
        head = []
        if isinstance(body.get("instructions"), str):
            head.append({"role": "system", "content": body["instructions"]})
        items = body.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        elif not isinstance(items, list):
            items = []
        return _opening(head + items)
    return None


def _raw_prompt(body: dict[str, Any]) -> str | None:
    for key in ("prompt", "input_prefix"):
        value = body.get(key)
        if value is None:
            continue
        text = value if isinstance(value, str) else _canonical(value)
        return text
    return None


def fingerprint(
    header: Callable[[str], str | None],
    body: dict[str, Any] | None,
    path: str,
    chars: int = 4096,
) -> str:
    """The conversation's fingerprint: 16 hex chars of SHA-256, or "" for "the route itself".

    `header` looks a request header up by name; `body` is the parsed JSON object (or None);
    `path` is the llama-server path (it tells a Responses `input` from an embeddings one);
    `chars` is how much of a raw prompt is hashed.
    """
    for name in SESSION_HEADERS:
        value = header(name)
        if value:
            return _digest("session", value.strip())
    if not isinstance(body, dict):
        return ""
    key = body.get("prompt_cache_key")
    if isinstance(key, str) and key:
        return _digest("session", key)
    opening = _chat_opening(body, path)
    if opening:
        return _digest("chat", _canonical(opening))
    prompt = _raw_prompt(body)
    if prompt:
        return _digest("prompt", prompt[:chars])
    return ""
