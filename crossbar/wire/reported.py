"""The one rule for numbers a host reports (docs/reference.md, "Hosts": what a host reports).

A host's answer says how many tokens it read and wrote and how long that took; its `/props`
says its slots and context; a token count says a prompt's length. A broken build, a proxy in
the middle or a compromised box can put anything valid in JSON there: 2^63, 10^400, -100000,
1e-320. One such answer must cost no more than that one answer, so every such number is
checked here before crossbar stores, charges or learns from it:

- a token count is an integer from 0 to MAX_TOKENS (not the host's context: an embeddings
  batch sums its inputs, and a host with context shift writes past it), and the cached part
  of a prompt is no larger than the prompt;
- a time is a finite number of milliseconds from 0 to MAX_MS.

An answer whose counts break the rule keeps what crossbar saw itself (the stream's events) and
nothing the host said; the reason is counted per host (`refusal` names it).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

# 2^31 - 1: fits a 32-bit column, a float exactly, and every sum crossbar keeps of them; a
# million-token context is 2^20.
MAX_TOKENS = 2**31 - 1
MAX_MS = 86_400_000.0  # a day: no answer's prefill or output takes longer
MAX_SLOTS = 65_536  # slots a host may say it has (llama-server's -np is tens at most)

# Why a host's numbers were refused: the label values of crossbar_host_reports_refused_total.
REPORT_REASONS = ("tokens_out_of_range", "cached_over_prompt", "time_out_of_range")


class Counted(Protocol):
    """What an answer's counts are read into (wire/meter.py `Tokens`)."""

    prompt: int
    cached: int
    completion: int
    prompt_ms: float
    predicted_ms: float


def count(value: Any, most: int = MAX_TOKENS) -> int | None:
    """`value` when it is an integer count from 0 to `most` (a JSON bool is not), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most:
        return value
    return None


def positive(value: Any, most: int = MAX_TOKENS) -> int | None:
    """`value` when it is an integer from 1 to `most`, else None."""
    found = count(value, most)
    return found if found else None


def millis(value: Any) -> float | None:
    """A time a host reports, as a float; None when it is not a number. Past a float's range
    it is infinite (and refused by `refusal`), never an OverflowError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def refusal(tokens: Counted) -> str:
    """Why `tokens` cannot be what an answer did (one of REPORT_REASONS), or "" when they can."""
    if not all(0 <= n <= MAX_TOKENS for n in (tokens.prompt, tokens.cached, tokens.completion)):
        return "tokens_out_of_range"
    if tokens.cached > tokens.prompt:
        return "cached_over_prompt"
    if not all(0.0 <= ms <= MAX_MS for ms in (tokens.prompt_ms, tokens.predicted_ms)):
        return "time_out_of_range"  # NaN compares false: refused too
    return ""
