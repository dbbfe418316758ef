"""Conversation fingerprints: what keeps turn 1 and turn 40 on the same host
(docs/reference.md, "Fingerprints")."""

from __future__ import annotations

import hashlib
from typing import Any

from crossbar.wire import Dialect, HeaderReader, canonical

# Session ids clients already send, in the order they are trusted.
SESSION_HEADERS = (
    "X-Crossbar-Conversation",
    "X-Session-Id",
    "X-Claude-Code-Session-Id",
    "X-Session-Affinity",
    "Session-Id",
    "Session_Id",
)


def _digest(kind: str, data: str) -> str:
    raw = data.encode("utf-8", "surrogatepass")
    return hashlib.sha256(kind.encode() + b"\0" + raw).hexdigest()[:16]


def fingerprint(header: HeaderReader, body: Any, dialect: Dialect, chars: int = 4096) -> str:
    """The conversation's fingerprint: 16 hex chars of SHA-256, or "" for "the route itself".

    In order: a session id the client sends (headers, then the body's `prompt_cache_key`);
    the dialect's conversation opening (leading system messages and the first user message);
    its raw prompt's first `chars` characters.
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
    opening = dialect.opening(body)
    if opening:
        return _digest("chat", canonical(opening))
    prompt = dialect.raw_prompt(body)
    if prompt:
        return _digest("prompt", prompt[:chars])
    return ""
