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
    session = session_id(header, body)
    if session is not None:
        return _digest("session", session)
    return opening_digest(body, dialect, chars)


def conversation(
    header: HeaderReader, body: Any, dialect: Dialect, chars: int, opening: bool
) -> tuple[str, str]:
    """The fingerprint and, with `opening` (an inference turn, whose cache truth needs it),
    the opening digest: computed once when the fingerprint is the opening itself."""
    session = session_id(header, body)
    if session is None:
        digest = opening_digest(body, dialect, chars)
        return digest, digest
    return _digest("session", session), opening_digest(body, dialect, chars) if opening else ""


def scoped(fp: str, tenant: str) -> str:
    """The fingerprint a request of the named key `tenant` leases under: `fp` hashed with the
    key's name, so two keys never share a lease, whatever session id or opening they send.
    `fp` itself with no named key (anonymous routes, a route's own `keys`), and "" (the route
    itself) stays "". `fp` is 16 hex chars, so `fp + tenant` reads one way only."""
    if not fp or not tenant:
        return fp
    return _digest("tenant", fp + tenant)


def session_id(header: HeaderReader, body: Any) -> str | None:
    """The session id the client sends (a header, else the body's `prompt_cache_key`)."""
    for name in SESSION_HEADERS:
        value = header(name)
        if value:
            return value.strip()
    key = body.get("prompt_cache_key") if isinstance(body, dict) else None
    return key if isinstance(key, str) and key else None


def opening_digest(body: Any, dialect: Dialect, chars: int = 4096) -> str:
    """What the prompt of `body` begins with, hashed: the dialect's conversation opening, else
    its raw prompt's first `chars` characters; "" when it has neither. The fingerprint when no
    session id is sent; under one, it tells the session's separate prompts apart (an agent's
    title request beside its conversation)."""
    if not isinstance(body, dict):
        return ""
    opening = dialect.opening(body)
    if opening:
        return _digest("chat", canonical(opening))
    prompt = dialect.raw_prompt(body)
    if prompt:
        return _digest("prompt", prompt[:chars])
    return ""


def system_digest(body: Any, dialect: Dialect) -> str:
    """The leading system (or developer) messages of `body`'s conversation opening, hashed:
    the prefix a batch's requests share when they differ only in what they ask; "" when the
    opening has none."""
    if not isinstance(body, dict):
        return ""
    opening = dialect.opening(body)
    system = [m for m in opening or () if m["role"] != "user"]  # the opening's leading ones
    return _digest("system", canonical(system)) if system else ""
