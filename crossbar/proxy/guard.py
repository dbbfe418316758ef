"""The context guard: refuse a prompt that cannot fit a slot before it costs a prefill
(docs/reference.md, "Context guard").

crossbar is never stricter than llama-server. llama-server refuses a prompt only when the prompt
itself does not fit the slot; a `max_tokens`/`n_predict` beyond the rest of the context is served
and generation stops at the end of the context (Claude Code always asks for 32000). So the guard
weighs the prompt alone, and refuses only on the host's exact count: a characters-times-ratio
estimate can err either way, so it only ever decides to skip the count.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from attrs import define, field

from crossbar.wire import bad_request

# Until a model's ratio is learned. Real tokenizers give about 0.23-0.3 tokens a character for
# English and more for code. Starting below that makes an unlearned estimate err low, so it
# skips counting only prompts far from the limit; the ones it wrongly skips are still refused by
# the host itself before any prefill.
DEFAULT_TOKENS_PER_CHAR = 0.2
BAND = 0.2  # an estimate within 20% of the limit (or over it) is counted exactly
_WEIGHT = 0.2  # of each new sample in the learned ratio


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
        chars: int,
        count: Callable[[], Awaitable[int | None]],
    ) -> int | None:
        """Raise 400 context_length_exceeded when a prompt of `chars` characters, counted
        exactly by the host, does not fit a slot of `limit` tokens (llama-server refuses a
        prompt of `limit` tokens or more: `n_tokens >= n_ctx` in server-context.cpp).

        `count` asks the host for that exact count (None when it cannot: then the host decides
        itself). It is skipped only when the estimate is well under the limit. Returns the
        exact count when the host counted (None otherwise).
        """
        if not limit:
            return None
        if chars * self.ratio(model) < (1 - BAND) * limit:
            return None
        self.exact_counts += 1
        exact = await count()
        if exact is None:
            return None  # no count, no refusal: the host will say so itself if it does not fit
        self.learn(model, chars, exact)
        if exact >= limit:  # llama-server's own rule: a prompt must leave room for one token
            self._refuse(exact, limit, host)
        return exact

    def _refuse(self, tokens: int, limit: int, host: str) -> None:
        self.refused += 1
        raise bad_request(
            f"this prompt needs {tokens} tokens, more than fit the {limit}-token context of a "
            f"slot on host {host} (a prompt must leave room for one reply token): shorten the "
            "conversation",
            code="context_length_exceeded",
        )
