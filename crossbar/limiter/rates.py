"""How fast each host works, learned from its own answers (docs/reference.md, "Slots": rates).

Every answer of llama-server carries `timings`: the prompt tokens it prefilled now and how long
that took (`prompt_n`, `prompt_ms`), and the tokens it generated and how long that took
(`predicted_n`, `predicted_ms`). Per (host, model) they give a prefill rate and a decode rate,
each a decaying ratio of sums (tokens over seconds, the older sums weighing DECAY less with
each new answer): a big prefill weighs more than a small one, as it should for estimating the
next big one, and a host that slows down is followed within a few answers. An answer without
`timings` (an API that drops them) teaches from what crossbar saw instead: the time to its
first byte for the prefill, the rest of a stream for the decode.

A request also holds its slot for what the timings leave out: the HTTP exchange, tokenizing and
templating its prompt, sampling set-up. That `overhead` (the time to the first byte less the
prefill, or for an answer that comes whole, less its output too) is a running mean per (host,
model), 0 until an answer has shown it.

What the rates cannot see, the hold times do: a prompt the host had evicted after all, a host
slower than its timings say while it shares its machine, replies longer than expected. Each
request's slot hold is compared with what these rates expected of it when it got the slot;
the running mean of the ratio (its `factor`, within FACTOR_RANGE) scales every expected hold of
the (host, model).

A router-mode host loads a model on its first request (and again after unloading it): the
request that made it load waits for the load before its first byte. That wait, less its prefill
and overhead, is the (host, model)'s load time (`load`), a running mean; before one is seen, the
mean of the model's other hosts' load times, else DEFAULT_LOAD.

Before a (host, model) has answered, its rates are the mean of the model's other hosts'
learned rates, else DEFAULT_PREFILL and DEFAULT_DECODE. A route's turns write `output_mean`
tokens on average (a running mean of every answered turn's completion tokens), which is what a
request that sets no `max_tokens` is expected to write; DEFAULT_OUTPUT before any has answered.
"""

from __future__ import annotations

import math
from typing import Any

from attrs import define

Pair = tuple[str, str]  # (host, model)

# Before any answer: a GPU box prefills thousands of tokens a second and decodes tens; these
# err slow on prefill (a move looks dearer, so the first guesses keep conversations home).
DEFAULT_PREFILL = 1000.0
DEFAULT_DECODE = 30.0
DEFAULT_OUTPUT = 256  # tokens a turn writes, until a route's answers say
# Seconds a router takes to load a model, until one load has been seen: a big model's weights
# from disk and its warm-up on a GPU box take tens of seconds (a 270M model on a CPU, about 1).
DEFAULT_LOAD = 20.0
_LOAD_WEIGHT = 0.5  # of the newest load in its (host, model)'s mean
DECAY = 0.9  # of the older sums at each new sample: about the last ten answers count
_OUTPUT_WEIGHT = 0.2  # of the newest completion in a route's running mean
_OVERHEAD_WEIGHT = 0.2  # of the newest answer's overhead in its (host, model)'s mean
_FACTOR_WEIGHT = 0.3  # of the newest hold's ratio in its (host, model)'s factor
FACTOR_RANGE = (0.5, 4.0)  # a factor is never learned past these: an estimate stays an estimate
_MIN_ESTIMATE = 0.05  # seconds: holds expected shorter than this teach no factor (noise)
# Samples too small to say anything: a few tokens' prefill is mostly the request's overhead.
_MIN_PREFILL_TOKENS = 8
_MIN_DECODE_TOKENS = 2


@define
class _Rate:
    """Tokens per second as a decaying ratio of sums."""

    tokens: float = 0.0
    seconds: float = 0.0

    def add(self, tokens: float, seconds: float) -> None:
        self.tokens = self.tokens * DECAY + tokens
        self.seconds = self.seconds * DECAY + seconds

    @property
    def value(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None


def _finite_rate(tokens: float, seconds: float) -> bool:
    """A sample teaches a rate only when its own rate is finite: a subnormal time (1e-320 ms,
    which a host may report) would make the sums' ratio infinite, and every estimate with it."""
    return seconds > 0 and math.isfinite(seconds) and math.isfinite(tokens / seconds)


class Rates:
    """Prefill and decode rates per (host, model), and each route's mean output."""

    def __init__(self) -> None:
        self._prefill: dict[Pair, _Rate] = {}
        self._decode: dict[Pair, _Rate] = {}
        self._output: dict[str, float] = {}
        self._overhead: dict[Pair, float] = {}
        self._factor: dict[Pair, float] = {}
        self._load: dict[Pair, float] = {}

    def learn(
        self,
        host: str,
        model: str,
        prefilled: int,
        prefill_seconds: float,
        decoded: int,
        decode_seconds: float,
    ) -> None:
        """One answer: `prefilled` prompt tokens took `prefill_seconds`, `decoded` output
        tokens `decode_seconds`. Samples too small to tell a rate are skipped."""
        pair = (host, model)
        if prefilled >= _MIN_PREFILL_TOKENS and _finite_rate(prefilled, prefill_seconds):
            self._prefill.setdefault(pair, _Rate()).add(prefilled, prefill_seconds)
        if decoded >= _MIN_DECODE_TOKENS and _finite_rate(decoded, decode_seconds):
            self._decode.setdefault(pair, _Rate()).add(decoded, decode_seconds)

    def learn_overhead(self, host: str, model: str, seconds: float) -> None:
        """One answer spent `seconds` of its slot's time outside its prefill and output."""
        _follow(self._overhead, (host, model), max(0.0, seconds), _OVERHEAD_WEIGHT)

    def overhead(self, host: str, model: str) -> float:
        """Seconds a request of `model` holds a slot of `host` beyond its prefill and output."""
        return self._overhead.get((host, model), 0.0)

    def learn_load(self, host: str, model: str, seconds: float) -> None:
        """Loading `model` on router-mode `host` took `seconds`."""
        _follow(self._load, (host, model), max(0.0, seconds), _LOAD_WEIGHT)

    def load(self, host: str, model: str) -> float:
        """Seconds `host` takes to load `model` (module doc: before one is seen)."""
        own = self._load.get((host, model))
        if own is not None:
            return own
        others = [s for (_, m), s in self._load.items() if m == model]
        return sum(others) / len(others) if others else DEFAULT_LOAD

    def load_source(self, host: str, model: str) -> str:
        """Where `load` comes from: `learned`, `model` (its other hosts) or `default`."""
        if (host, model) in self._load:
            return "learned"
        return "model" if any(m == model for _, m in self._load) else "default"

    def learn_hold(self, host: str, model: str, expected: float, held: float) -> None:
        """A request held its slot `held` seconds where `expected` were expected of it."""
        if expected < _MIN_ESTIMATE or held < 0:
            return
        low, high = FACTOR_RANGE
        _follow(self._factor, (host, model), min(high, max(low, held / expected)), _FACTOR_WEIGHT)

    def factor(self, host: str, model: str) -> float:
        """How much longer than these rates expect the (host, model)'s slots are held."""
        return self._factor.get((host, model), 1.0)

    def learn_output(self, route: str, completion: int) -> None:
        """A turn of `route` wrote `completion` tokens."""
        _follow(self._output, route, float(completion), _OUTPUT_WEIGHT)

    def prefill(self, host: str, model: str) -> float:
        """Prompt tokens per second `host` prefills for `model` (module doc: its defaults)."""
        return self._rate(self._prefill, host, model, DEFAULT_PREFILL)

    def decode(self, host: str, model: str) -> float:
        """Output tokens per second one of `host`'s slots writes for `model`."""
        return self._rate(self._decode, host, model, DEFAULT_DECODE)

    def output(self, route: str) -> float:
        """The tokens a turn of `route` is expected to write when it sets no limit."""
        return self._output.get(route, DEFAULT_OUTPUT)

    def knows_output(self, route: str) -> bool:
        """Whether `route`'s turns have taught a mean output yet."""
        return route in self._output

    def source(self, host: str, model: str) -> str:
        """Where (host, model)'s rates come from: `learned` (its own answers), `model` (the
        mean of the model's other hosts) or `default`."""
        pair = (host, model)
        if pair in self._prefill or pair in self._decode:
            return "learned"
        if any(m == model for _, m in (*self._prefill, *self._decode)):
            return "model"
        return "default"

    def status(self, host: str, model: str) -> dict[str, Any]:
        """(host, model)'s rates for GET /api/hosts."""
        return {
            "prefill_tokens_per_second": round(self.prefill(host, model), 1),
            "decode_tokens_per_second": round(self.decode(host, model), 1),
            "overhead_seconds": round(self.overhead(host, model), 3),
            "hold_factor": round(self.factor(host, model), 2),
            "rates_source": self.source(host, model),
        }

    def forget(self, keep: set[str]) -> None:
        """Drop what was learned of hosts not in `keep` (a reload removed them)."""
        for table in (self._prefill, self._decode, self._overhead, self._factor, self._load):
            for pair in [p for p in table if p[0] not in keep]:
                del table[pair]

    @staticmethod
    def _rate(table: dict[Pair, _Rate], host: str, model: str, default: float) -> float:
        own = table.get((host, model))
        if own is not None and own.value is not None:
            return own.value
        others = [r.value for (_, m), r in table.items() if m == model and r.value is not None]
        return sum(others) / len(others) if others else default


def _follow(means: dict[Any, float], key: Any, value: float, weight: float) -> None:
    """Move the running mean `means[key]` towards `value` by `weight` (the first value is it)."""
    mean = means.get(key)
    means[key] = value if mean is None else mean + weight * (value - mean)
