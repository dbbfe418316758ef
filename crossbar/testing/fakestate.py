"""The fake llama-server's knobs, fault switches and counters."""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from typing import Any, Protocol

from attrs import Attribute, asdict, define, field, fields, frozen, setters

from crossbar.testing.fakecache import PromptCache
from crossbar.testing.faketokens import Tokenizer

SEEN_KEPT = 100  # requests whose headers the fake keeps for tests


def _positive(_: object, attribute: Attribute[Any], value: float) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be positive, not {value!r}")


def _not_negative(_: object, attribute: Attribute[Any], value: float) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must not be negative, not {value!r}")


def _models(_: object, attribute: Attribute[Any], value: list[str]) -> None:
    if not value or not all(isinstance(m, str) and m for m in value):
        raise ValueError("models must be a non-empty list of names")


def _switch(_: object, attribute: Attribute[Any], value: object) -> None:
    if type(value) is not bool:
        raise ValueError(f"{attribute.name} must be true or false, not {value!r}")


@define
class FakeConfig:
    """How the fake behaves. `ctx` is tokens per slot (what `/props` and `/slots` report)."""

    models: list[str] = field(factory=lambda: ["qwen-coder"], validator=_models)
    parallel: int = field(default=2, validator=_positive)
    ctx: int = field(default=4096, validator=_positive)
    tokens_per_second: float = field(default=0, validator=_not_negative)  # 0: no delay
    prefill_ms_per_token: float = field(default=0, validator=_not_negative)
    cache_slots: int = field(default=4, validator=_not_negative)  # idle caches kept (LRU)
    load_delay: float = field(default=0, validator=_not_negative)  # seconds of "Loading model"
    reply_tokens: int = field(default=16, validator=_not_negative)  # when no max_tokens
    # A reply ends by itself (EOS, finish "stop") after this many tokens whatever max_tokens
    # allows, as a real model's does; None: it runs to its limit (the tests' default).
    eos_after: int | None = None
    # llama-server refuses `previous_response_id` (tools/server/server-chat.cpp); on, the fake
    # keeps responses instead, as OpenAI's own API and some routers do.
    keep_responses: bool = field(default=False, validator=_switch)
    # llama-server continues a trailing assistant message (chat, Anthropic), its answer starting
    # with that text (the first streamed delta is it and the first new token);
    # `--no-prefill-assistant` (False here) answers it as a finished turn instead.
    prefill_assistant: bool = field(default=True, validator=_switch)
    # llama-server's `--api-key`: every path but /health and /v1/health then needs it, as
    # `Authorization: Bearer <key>` or `X-Api-Key`, else 401 (tools/server/server-http.cpp).
    api_key: str = field(default="", repr=False)


def _chunks(_: object, attribute: Attribute[Any], value: object) -> None:
    if value is not None and (type(value) is not int or value < 0):
        raise ValueError(f"{attribute.name} must be null or a count >= 0, not {value!r}")


def _busy(_: object, attribute: Attribute[Any], value: object) -> None:
    if value is not None and value not in (429, 503):
        raise ValueError(f"{attribute.name} must be null, 429 or 503, not {value!r}")


def _report(_: object, attribute: Attribute[Any], value: object) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or not set(value) <= {"usage", "timings"}:
        raise ValueError(f"{attribute.name} must be null or an object of usage and timings")
    if not all(isinstance(v, dict) for v in value.values()):
        raise ValueError(f"{attribute.name}: usage and timings must be objects")


def _refuse_changed(faults: Faults, _: Attribute[Any], value: bool) -> bool:
    # The listener has to follow this switch; the owner is told the new value (the attribute
    # still holds the old one while this hook runs).
    if faults._on_refuse is not None and value != faults.refuse:
        faults._on_refuse(value)
    return value


@define
class Faults:
    """Switches a test flips to make the fake misbehave. Each takes effect at once: for new
    requests, and (drop, reset, stall) for streams already running at their next event.

    - `refuse`: stop listening and drop open connections (a dead host); off listens again on
      the same port. `await fake.settle()` waits until the listener has followed.
    - `error_500`: inference answers 500.
    - `busy`: inference answers this status at once (429 or 503), as a
      server whose own queue is full does; `/health` still answers 200.
    - `hang`: inference requests are accepted and never answered, not even headers (a stuck
      generation); `/health` and the control paths still answer.
    - `drop_after_chunks`: a stream is cut (TCP close, no terminating chunk) after N SSE
      events; 0 also cuts non-streaming inference before any response byte.
    - `reset_after_chunks`: as `drop_after_chunks`, but the cut is a TCP reset (RST): the
      client reads the N events, then ECONNRESET rather than an end of stream.
    - `stall_after_chunks`: a stream goes silent after N SSE events, connection kept open;
      0 also stalls non-streaming inference before any response byte.
    - `cut_once`: each of those three cuts one request, then turns itself off (None), at the
      cut: "cut once, then the host works again", with no race against a retry the client
      sends by itself (a test that turns the switch off after the cut may lose it).
    - `loading`: `/health` and every other llama-server path answer 503 "Loading model".
    - `report`: a lying host: `{"usage": {...}, "timings": {...}}` whose fields replace those
      of every answer's `usage` and `timings` (any JSON: 2**63, 1e-320, -100000).
    """

    refuse: bool = field(
        default=False, validator=_switch, on_setattr=setters.pipe(setters.validate, _refuse_changed)
    )
    error_500: bool = field(default=False, validator=_switch)
    busy: int | None = field(default=None, validator=_busy)
    hang: bool = field(default=False, validator=_switch)
    drop_after_chunks: int | None = field(default=None, validator=_chunks)
    reset_after_chunks: int | None = field(default=None, validator=_chunks)
    stall_after_chunks: int | None = field(default=None, validator=_chunks)
    cut_once: bool = field(default=False, validator=_switch)
    loading: bool = field(default=False, validator=_switch)
    report: dict[str, Any] | None = field(default=None, validator=_report)
    _on_refuse: Callable[[bool], None] | None = field(
        default=None, repr=False, eq=False, init=False
    )

    def follow_refuse(self, callback: Callable[[bool], None] | None) -> None:
        """Call `callback(new_value)` whenever `refuse` changes (the fake's listener does)."""
        self._on_refuse = callback

    def as_dict(self) -> dict[str, Any]:
        return asdict(self, filter=lambda a, _: not a.name.startswith("_"))

    def update(self, changes: dict[str, Any]) -> None:
        """Set several switches from JSON; unknown names and bad values raise ValueError
        before anything changes."""
        names = {a.name for a in fields(Faults) if not a.name.startswith("_")}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise ValueError(f"unknown fault(s): {', '.join(unknown)}; known: {sorted(names)}")
        merged = {**self.as_dict(), **changes}
        Faults(**merged)  # validates every value first
        for name, value in changes.items():
            setattr(self, name, value)


@frozen
class Completion:
    """One inference request that got a slot, as it ended."""

    id: str
    path: str
    model: str
    slot: int
    stream: bool
    prompt_tokens: int
    cache_n: int
    prompt_n: int
    completion_tokens: int
    text: str
    outcome: str  # "done", "aborted" (client left), "dropped" (the fake cut it)
    opening: str = ""  # a chat's first user message: which conversation it was


@define
class Counters:
    """What the fake has seen; tests read these. Request counts leave out `/_fake/` paths."""

    requests: Counter[str] = field(factory=Counter)  # per path
    prefill_tokens: int = 0  # prompt tokens processed (not taken from a cache)
    cached_tokens: int = 0  # prompt tokens reused from a cache
    predicted_tokens: int = 0
    aborted: int = 0  # requests whose client closed before the fake finished
    dropped: int = 0  # requests the fake cut (drop_ and reset_after_chunks, refuse, stop)
    in_flight: int = 0  # inference requests being handled, queued ones included
    peak_in_flight: int = 0
    queued: int = 0  # inference requests waiting for a slot
    chunks_sent: int = 0  # SSE events written, `[DONE]` included, all streams together
    completions: list[Completion] = field(factory=list)
    # (path, twisted.web Headers) of the latest requests, oldest first: what crossbar sent.
    seen: deque[tuple[str, Any]] = field(factory=lambda: deque(maxlen=SEEN_KEPT))

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self, filter=lambda a, _: a.name not in ("completions", "seen"))
        out["requests"] = dict(self.requests)
        out["completions"] = len(self.completions)
        out["last_completion"] = asdict(self.completions[-1]) if self.completions else None
        return out


class Fake(Protocol):
    """The fake llama-server as its request handlers (fakeapi.py, fakegen.py) use it
    (fakellama.FakeLlama): its state and the few things it does for them."""

    reactor: Any
    config: FakeConfig
    faults: Faults
    counters: Counters
    tokenizer: Tokenizer
    cache: PromptCache
    api: Any  # the FakeApi serving it
    running: dict[str, str]  # completion id -> path, while it runs
    conversations: OrderedDict[str, list[dict[str, Any]]]
    saved_slots: dict[str, list[int]]
    started_at: float

    @property
    def loading(self) -> bool: ...

    def refuse_for(self, seconds: float) -> None: ...

    def spare_connection(self, request: Any) -> None: ...

    def remember(self, response_id: str, conversation: list[dict[str, Any]]) -> None: ...

    def record(self, completion: Completion) -> None: ...
