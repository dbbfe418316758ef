"""The chat bodies the peers bench posts: one short user turn, and a ~100 KB agent conversation
(a long system prompt, tool definitions, tool calls and their results), each with a placeholder
where the conversation's number goes, so wrk can send each conversation its own first message.
Built once and deterministically: every sitting posts the same bytes."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from bench.fleet.scale import MODEL

PLACEHOLDER = "@@CONVERSATION@@"


def small_body() -> dict[str, Any]:
    """One short user turn: the conversation is the first user message."""
    turn = {"role": "user", "content": f"Conversation {PLACEHOLDER}: refactor the parser."}
    return {"model": MODEL, "max_tokens": 1, "messages": [turn]}


def _code(i: int, lines: int) -> str:
    """A deterministic source file's text, `lines` long, different for each `i`."""
    out = [f"# module_{i}.py: step {i} of the pipeline", "from __future__ import annotations", ""]
    for j in range(lines):
        out.append(f"def step_{i}_{j}(value: int, scale: int = {j % 7 + 1}) -> int:")
        out.append(f'    """Step {j} of stage {i}: scale, shift by {i * j % 97}, clamp."""')
        out.append(f"    return max(0, min(value * scale + {i * j % 97}, {1000 + j}))")
    return "\n".join(out)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {arg: {"type": "string", "description": f"the {arg}"}},
                "required": [arg],
            },
        },
    }
    for name, description, arg in (
        ("read_file", "Read a file of the repository and return its text.", "path"),
        ("grep", "Search the repository for a regular expression; matching lines.", "pattern"),
        ("run_tests", "Run the test suite (or one test) and return its output.", "selector"),
        ("edit_file", "Replace one exact string in a file with another.", "path"),
    )
]


def agent_body(size: int = 100 * 1024) -> dict[str, Any]:
    """An agent's chat body of about `size` bytes: a long system prompt (~25 KB of rules), tool
    definitions, the first user message (the conversation), then tool calls and their results
    (files read, tests run) until the size is reached, and a last user turn."""
    rules = [
        f"Rule {i}: when the task touches {topic}, read the relevant files first, keep each "
        f"change small, run the tests that cover it, and say what you changed and why in one "
        f"sentence; never invent an API, and quote the error messages you saw exactly."
        for i, topic in enumerate(
            f"{area} of module {m}"
            for m in range(20)
            for area in ("the parser", "the store", "the HTTP layer", "logging", "the config")
        )
    ]
    system = "You are a careful coding agent working in a Python repository.\n" + "\n".join(rules)
    first = {
        "role": "user",
        "content": f"Conversation {PLACEHOLDER}: the parser drops the last field of a quoted "
        "record; find why, fix it, and add a test.",
    }
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, first]
    body = {"model": MODEL, "max_tokens": 1, "tools": TOOLS, "messages": messages}
    last = {"role": "user", "content": "Good. Now run the whole suite and summarise."}
    i = 0
    while len(json.dumps(body)) + len(json.dumps(last)) < size - 3000:
        name, args, result = (
            ("read_file", {"path": f"src/module_{i}.py"}, _code(i, 12))
            if i % 3 != 2
            else ("run_tests", {"selector": f"tests/test_module_{i}.py"},
                  "\n".join(f"tests/test_module_{i}.py::test_case_{k} PASSED" for k in range(40)))
        )  # fmt: skip
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)}}  # fmt: skip
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": result})
        i += 1
    messages.append(last)
    return body


@cache
def body_parts(kind: str) -> tuple[bytes, bytes]:
    """The body of `kind` as (text before, text after) the conversation's number."""
    body = small_body() if kind == "small" else agent_body()
    text = json.dumps(body)
    assert text.count(PLACEHOLDER) == 1
    before, after = text.split(PLACEHOLDER)
    return before.encode(), after.encode()


def body_for(kind: str, n: int) -> bytes:
    """Conversation `n`'s body of `kind`, as wrk sends it (for the test and a look)."""
    before, after = body_parts(kind)
    return before + str(n).encode() + after
