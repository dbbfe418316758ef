"""The context guard (SPEC §7): refuse a prompt that cannot fit before it costs a prefill."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from attrs import define, field

from crossbar.errors import bad_request

# Until a model's ratio is learned. Real tokenizers give about 0.23-0.3 tokens a character for
# English and more for code. Starting below that makes an unlearned estimate err low: a prompt
# that fits is never refused on a guess; one that does not is caught by the exact count near the
# limit, or by the host itself (which refuses it before any prefill).
DEFAULT_TOKENS_PER_CHAR = 0.2
BAND = 0.2  # within 20% of the limit, count exactly
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
        output: int,
        count: Callable[[], Awaitable[int | None]],
    ) -> None:
        """Raise 400 context_length_exceeded when a prompt of `chars` characters plus `output`
        requested tokens cannot fit in `limit` tokens.

        `count` asks the host for an exact prompt count (None when it cannot); it is called
        only when the estimate lands within BAND of the limit.
        """
        if not limit:
            return
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
