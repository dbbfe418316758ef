"""Request classes (docs/reference.md, "Slots": classes): whether a person waits on a request.

Three, ordered: `interactive` (an agent's turn, a chat: a person waits on each), `standard` (the
default) and `batch` (an eval run, a nightly job, a swarm no one watches). Within a (host, model)
a higher class is admitted before every lower one, and batch never holds the slots a route
keeps for the other two.

A request's class comes from, first to last: the `X-Crossbar-Class` header; the body's
`service_tier` as OpenAI's and Anthropic's clients send it; a hint a known client sends
(`CLIENT_HINTS`); its key's `class`; its route's `class`; else `standard`. A key's `max_class`
caps what its requests may claim: a batch key cannot call itself interactive.
"""

from __future__ import annotations

INTERACTIVE, STANDARD, BATCH = "interactive", "standard", "batch"
CLASSES = (BATCH, STANDARD, INTERACTIVE)  # lowest first: a class's rank is its index
RANK = {name: rank for rank, name in enumerate(CLASSES)}
HEADER = "x-crossbar-class"

# `service_tier` as OpenAI's API takes it (Anthropic's takes `auto` and `standard_only`):
# `flex` is OpenAI's cheaper, slower tier (batch), `priority` its faster one; the rest ask for
# what the key would get anyway. A value no API has is left to the rules after it.
SERVICE_TIERS: dict[str, str | None] = {
    "flex": BATCH,
    "priority": INTERACTIVE,
    "auto": None,
    "default": None,
    "standard_only": None,
    "scale": None,
}

# Headers known clients send of their own accord, and the class each value means. Claude Code
# marks every request with `x-claude-code-request-class` (notes/llama-server.md): its main loop,
# a subagent's work and a compaction block the person at the terminal; a side reply answers
# them; a workflow (a scripted, headless run) and auxiliary calls (titles, summaries) do not.
# Codex (`x-openai-subagent`) and OpenCode (`x-parent-session-id`) mark subagents only: their
# turns are the person's too, so no hint of theirs lowers a class; room is left for them here.
CLIENT_HINTS: dict[str, dict[str, str]] = {
    "x-claude-code-request-class": {
        "main": INTERACTIVE,
        "subagent": INTERACTIVE,
        "compaction": INTERACTIVE,
        "side_reply": INTERACTIVE,
        "workflow": STANDARD,
        "auxiliary": STANDARD,
    },
}


def class_error(value: object) -> str | None:
    """Why `value` is not a class name, or None when it is one."""
    if isinstance(value, str) and value in RANK:
        return None
    return f'must be "interactive", "standard" or "batch", not {value!r}'


def lowered(claimed: str, most: str) -> str:
    """`claimed`, no higher than `most`."""
    return claimed if RANK[claimed] <= RANK[most] else most
