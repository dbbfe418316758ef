"""The fake llama-server's tokenizer, chat template and deterministic replies.

Everything here is pure and stable across runs and processes, so a test can predict what the
fake will answer and how many tokens a prompt has. Two properties make the prompt-cache model
honest (see `fakecache`):

- rendering messages m1..mk is a token prefix of rendering m1..mk+1, and
- the tokens of a reply, sent back as the assistant message of the next turn, are exactly the
  tokens that were generated,

so turn 2 of a conversation shares (turn-1 prompt + reply) tokens with turn 1.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

# Special tokens are hard boundaries: text on either side is tokenized on its own, so
# appending a message never changes the tokens of what came before.
_SPECIAL = re.compile(r"(<\|[a-z_]+\|>)")
# A word or a punctuation mark with the spaces before it, a newline on its own, or trailing
# spaces. A newline never merges with the next word, so "assistant\n" + reply tokenizes as
# "assistant\n" then the reply.
_PIECE = re.compile(r"\n|[^\S\n]*\w+|[^\S\n]*[^\w\s]|[^\S\n]+")

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MEDIA = "<|media|>"

_WORDS = (
    "the model reads your prompt and writes a short answer that is stable across runs "
    "because every word comes from a hash of the tokens it was given so tests can predict "
    "what arrives cache slot token stream reply fake server proxy host route lease"
).split()


def piece_id(piece: str) -> int:
    """A stable id for a token piece (31 bits, so it fits any JSON integer)."""
    digest = hashlib.blake2b(piece.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


def split_pieces(text: str) -> list[str]:
    """The token pieces of `text`; joining them gives `text` back."""
    pieces: list[str] = []
    for part in _SPECIAL.split(text):
        if not part:
            continue
        if _SPECIAL.fullmatch(part):
            pieces.append(part)
        else:
            pieces.extend(_PIECE.findall(part))
    return pieces


class Tokenizer:
    """Words and punctuation, each one token, with stable ids; remembers pieces to detokenize."""

    def __init__(self) -> None:
        self._pieces: dict[int, str] = {}

    def tokenize(self, text: str) -> list[int]:
        return self.ids(split_pieces(text))

    def ids(self, pieces: Iterable[str]) -> list[int]:
        out = []
        for piece in pieces:
            tid = piece_id(piece)
            self._pieces[tid] = piece
            out.append(tid)
        return out

    def piece(self, token: int) -> str:
        """The text of a token this tokenizer has seen; unknown ids detokenize to nothing."""
        return self._pieces.get(token, "")

    def detokenize(self, tokens: Iterable[int]) -> str:
        return "".join(self.piece(t) for t in tokens)


def content_text(content: Any) -> str:
    """The text of a message `content`: a string, or an array of parts (text parts by their
    text, anything else as one media marker)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(part["text"])
            else:
                out.append(MEDIA)
        return "".join(out)
    raise ValueError("message content must be a string or an array of content parts")


def render_message(message: dict[str, Any]) -> str:
    """One ChatML-style turn: `<|im_start|>role\\ncontent<|im_end|>\\n`."""
    if not isinstance(message, dict):
        raise ValueError("each message must be an object")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise ValueError("each message needs a string 'role'")
    text = content_text(message.get("content"))
    if message.get("tool_calls"):
        text += json.dumps(message["tool_calls"], sort_keys=True)
    return f"{IM_START}{role}\n{text}{IM_END}\n"


def render_chat(messages: Any, add_generation_prompt: bool = True, prefill: bool = False) -> str:
    """The prompt for `messages`; with the assistant header when a reply is to follow. With
    `prefill`, a trailing assistant message is left open for the reply to continue, as
    llama-server renders it (its `--prefill-assistant`, on by default): the header, then its
    text, no end of turn."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty array")
    prefix = continued_text(messages) if prefill else None
    if prefix is not None:
        return "".join(render_message(m) for m in messages[:-1]) + f"{IM_START}assistant\n{prefix}"
    prompt = "".join(render_message(m) for m in messages)
    if add_generation_prompt:
        prompt += f"{IM_START}assistant\n"
    return prompt


def continued_text(messages: list[Any]) -> str | None:
    """The text of `messages`' trailing assistant message, which llama-server continues and
    echoes at the start of its answer: its text parts joined by a blank line (as its
    `common_chat_msg::render_content`); None when the last message is not the assistant's.
    ValueError, as llama-server's 400s, for what it cannot continue."""
    if not isinstance(messages, list) or not messages:
        return None  # not a chat llama-server could render: the renderer says why
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return None
    before = messages[-2] if len(messages) > 1 else None
    if isinstance(before, dict) and before.get("role") == "assistant":
        raise ValueError("Cannot have 2 or more assistant messages at the end of the list.")
    content = last.get("content")
    blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
    if last.get("tool_calls") or any(b.get("type") == "tool_use" for b in blocks):
        raise ValueError("Cannot continue an assistant message that contains tool calls.")
    if isinstance(content, str):
        return content
    return "\n\n".join(
        b["text"] for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str)
    )


def responses_messages(instructions: Any, input_: Any) -> list[dict[str, Any]]:
    """Chat messages for a Responses-API request's `instructions` and `input`."""
    messages: list[dict[str, Any]] = []
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(input_, str):
        messages.append({"role": "user", "content": input_})
    elif isinstance(input_, list):
        for item in input_:
            if not isinstance(item, dict):
                raise ValueError("each 'input' item must be an object")
            if "role" in item:
                messages.append({"role": item["role"], "content": item.get("content")})
            else:
                # function_call / function_call_output and friends: kept whole, so that a
                # chained turn still renders the same prefix.
                kind = str(item.get("type", "item"))
                messages.append({"role": kind, "content": json.dumps(item, sort_keys=True)})
    else:
        raise ValueError("'input' must be a string or an array of items")
    if not messages:
        raise ValueError("'input' is empty")
    return messages


def reply_pieces(prompt: list[int]) -> Iterator[str]:
    """The endless deterministic reply to `prompt`: the same prompt gives the same pieces, and
    a shorter reply is a prefix of a longer one. The pieces re-tokenize to themselves."""
    seed = hashlib.blake2b(b"".join(t.to_bytes(4, "big") for t in prompt), digest_size=16).digest()
    i = 0
    capital = True
    while True:
        h = int.from_bytes(hashlib.blake2b(seed + i.to_bytes(8, "big"), digest_size=8).digest())
        word = _WORDS[h % len(_WORDS)]
        if capital:
            word = word.capitalize()
        yield word if i == 0 else " " + word
        i += 1
        capital = False
        mark = (h >> 20) % 8
        if mark == 0:
            yield ","
        elif mark == 1:
            yield "."
            capital = True


def answer_pieces(prompt: list[int], prefix: str | None) -> tuple[Iterator[str], int]:
    """The pieces answering `prompt`, and how many tokens of that answer `prefix` (the
    continued trailing assistant message a chat prompt ends with; None: none) already holds.

    A greedy model continues its own cut answer as the answer would have gone on: when
    `prefix` is how the reply to the prompt before it starts, the rest of that reply follows,
    so a cut answer resumed anywhere reads as the uncut one. Any other prefix gets the reply
    to the whole prompt."""
    if not prefix:
        return reply_pieces(prompt), 0
    given = split_pieces(prefix)
    pieces = reply_pieces(prompt[: len(prompt) - len(given)])
    if [next(pieces) for _ in given] == given:
        return pieces, len(given)
    return reply_pieces(prompt), 0


def reply_text(prompt: list[int], n: int) -> str:
    """The first `n` tokens of the reply to `prompt`, as text."""
    pieces = reply_pieces(prompt)
    return "".join(next(pieces) for _ in range(n))
