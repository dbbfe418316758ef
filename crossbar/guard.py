"""The context guard (SPEC §7): refuse a prompt that cannot fit before it costs a prefill."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from attrs import define, field

from crossbar.errors import bad_request

# Until a model's ratio is learned. Real tokenizers give about 0.23-0.3 tokens a character for
# English and more for code. Starting below that makes an unlearned estimate err low: a prompt
# that fits is never refused on a guess; one that does not is caught by the exact count near the
# limit, or by the host itself (which refuses it before any prefill).
DEFAULT_TOKENS_PER_CHAR = 0.2
BAND = 0.2  # within 20% of the limit, count exactly
_WEIGHT = 0.2  # of each new sample in the learned ratio
_OUTPUT_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict")


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text(v) for v in value)
    if isinstance(value, dict):
        if isinstance(value.get("text"), str):
            return value["text"]
        return _text(value.get("content"))
    return ""


def prompt_chars(body: Any) -> int:
    """Characters of prompt text in a request body (messages, system, input, prompt...)."""
    if not isinstance(body, dict):
        return 0
    total = 0
    for key in ("system", "instructions", "prompt", "input_prefix", "input_suffix", "input"):
        total += len(_text(body.get(key)))
    for message in body.get("messages") or []:
        total += len(_text(message)) + 8  # role markers of the chat template
    if body.get("tools"):
        total += len(json.dumps(body["tools"]))
    return total


def requested_output(body: Any) -> int:
    """Tokens the client asked to generate, when it said (`max_tokens`, `n_predict`...)."""
    if not isinstance(body, dict):
        return 0
    for key in _OUTPUT_KEYS:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


@define
class ContextGuard:
    """Per-model learned tokens-per-character, and the decision for one request."""

    default_ratio: float = DEFAULT_TOKENS_PER_CHAR
    _ratios: dict[str, float] = field(factory=dict)
    exact_counts: int = 0
    refused: int = 0

    def ratio(self, model: str) -> float:
        return self._ratios.get(model, self.default_ratio)

    def learn(self, model: str, chars: int, tokens: int) -> None:
        """One observed (characters, prompt tokens) pair, from a usage row or an exact count."""
        if chars < 64 or tokens <= 0:
            return  # tiny prompts are mostly template overhead: they would skew the ratio
        sample = tokens / chars
        old = self._ratios.get(model)
        self._ratios[model] = sample if old is None else old + _WEIGHT * (sample - old)

    async def check(
        self,
        model: str,
        host: str,
        limit: int | None,
        body: Any,
        count: Callable[[], Awaitable[int | None]],
    ) -> None:
        """Raise 400 context_length_exceeded when the request cannot fit in `limit` tokens.

        `count` asks the host for an exact prompt count (None when it cannot); it is called
        only when the estimate lands within BAND of the limit.
        """
        if not limit:
            return
        chars = prompt_chars(body)
        output = requested_output(body)
        estimate = round(chars * self.ratio(model)) + output
        if estimate < (1 - BAND) * limit:
            return
        if estimate > (1 + BAND) * limit:
            self._refuse(estimate, output, limit, host, exact=False)
        self.exact_counts += 1
        exact = await count()
        if exact is None:
            return  # the host will say so itself if it does not fit
        self.learn(model, chars, exact)
        if exact + output > limit:
            self._refuse(exact + output, output, limit, host, exact=True)

    def _refuse(self, total: int, output: int, limit: int, host: str, exact: bool) -> None:
        self.refused += 1
        how = "" if exact else "about "
        asked = f" ({output} of them requested for the reply)" if output else ""
        raise bad_request(
            f"this request needs {how}{total} tokens{asked}, more than the {limit}-token "
            f"context of a slot on host {host}: shorten the conversation or lower max_tokens",
            code="context_length_exceeded",
        )
