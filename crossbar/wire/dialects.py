"""Every client API crossbar serves, one frozen value each: all the proxy must know of it.

A `Dialect` holds an API family's paths and their kind (inference, control, answered by
crossbar), how its bodies open a conversation (for the fingerprint), its prompt text and output
limit (for the context guard), the completion id it answers with and the id a call may name,
how its usage reads, how the host counts its prompt exactly, and the shape of its errors.
Routing picks the dialect once (`classify`); the call carries it. A new API is one new value
here, and its tests.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from typing import Any

from attrs import frozen

from crossbar.wire import bodies, meter

Body = dict[str, Any]


class Kind(enum.Enum):
    """What crossbar does with a request."""

    INFERENCE = "inference"  # takes a lease and a slot
    CONTROL = "control"  # goes to the lease's host, takes no slot
    MODELS = "models"  # answered by crossbar: the route's models
    HEALTH = "health"  # answered by crossbar: is some host of the route healthy
    BATCHES = "batches"  # answered by crossbar: the Batch API's files and batches


class ErrorShape(enum.Enum):
    """How an API writes its errors."""

    OPENAI = "openai"  # {"error": {"code", "type", "message"}}
    ANTHROPIC = "anthropic"  # {"type": "error", "error": {"type", "message"}}


def _never(path: str, body: Body) -> str | None:
    return None


def _none(body: Body) -> tuple[str, Body] | None:
    return None


@frozen
class Dialect:
    """One API family. The callables take the parsed JSON object of a request body."""

    name: str
    paths: Mapping[str, Kind]
    opening: Callable[[Body], list[bodies.Message] | None] = bodies.no_opening
    raw_prompt: Callable[[Body], str | None] = bodies.no_prompt
    prompt_chars: Callable[[Any], int] = bodies.prompt_chars
    # The remembered completion a call names: a control call's `id`, `previous_response_id`.
    named_id: Callable[[str, Body], str | None] = _never
    # (path, payload) of the host's exact prompt count, or None when the host has none.
    count_request: Callable[[Body], tuple[str, Body] | None] = _none
    read_usage: meter.Reader = meter.openai_usage
    read_id: meter.IdReader = meter.openai_id
    errors: ErrorShape = ErrorShape.OPENAI
    array_bodies: frozenset[str] = frozenset()  # paths whose POST body is a JSON array
    # The fields that limit a request's output tokens, the one to set first: what a route's
    # max_tokens_default and max_tokens_cap write (none: the API generates no tokens).
    output_fields: tuple[str, ...] = ()

    def meter(self, stream: bool, on_id: Callable[[str], None]) -> meter.Meter:
        """A meter reading this dialect's answers."""
        return meter.Meter(stream, self.read_usage, self.read_id, on_id)


def _control_id(path: str, body: Body) -> str | None:
    return body.get("id") if path == "/v1/chat/completions/control" else None


def _previous_response(path: str, body: Body) -> str | None:
    return body.get("previous_response_id")


def _tokenize(body: Body) -> tuple[str, Body] | None:
    prompt = body.get("prompt")
    return ("/tokenize", {"content": prompt}) if isinstance(prompt, str) else None


def _chat_count(body: Body) -> tuple[str, Body] | None:
    if isinstance(body.get("messages"), list):
        return "/v1/chat/completions/input_tokens", body
    return _tokenize(body)


def _chat_or_prompt(body: Body) -> list[bodies.Message] | None:
    return bodies.chat_opening(body)


OPENAI_CHAT = Dialect(
    "openai-chat",
    {
        "/v1/chat/completions": Kind.INFERENCE,
        "/v1/chat/completions/control": Kind.CONTROL,
        "/v1/chat/completions/input_tokens": Kind.CONTROL,
    },
    opening=bodies.chat_opening,
    raw_prompt=bodies.raw_prompt,
    named_id=_control_id,
    count_request=_chat_count,
    output_fields=("max_tokens", "max_completion_tokens", "n_predict"),
)
OPENAI_COMPLETIONS = Dialect(
    "openai-completions",
    {"/v1/completions": Kind.INFERENCE},
    raw_prompt=bodies.raw_prompt,
    count_request=_tokenize,
    output_fields=("max_tokens", "n_predict"),
)
LLAMA_COMPLETION = Dialect(
    "llama-completion",
    {"/completion": Kind.INFERENCE, "/completions": Kind.INFERENCE, "/infill": Kind.INFERENCE},
    raw_prompt=bodies.raw_prompt,
    count_request=_tokenize,
    output_fields=("n_predict", "max_tokens"),
)
EMBEDDINGS = Dialect(
    "embeddings",
    {"/v1/embeddings": Kind.INFERENCE, "/embedding": Kind.INFERENCE, "/embeddings": Kind.INFERENCE},
)
RERANK = Dialect("rerank", {"/v1/rerank": Kind.INFERENCE, "/reranking": Kind.INFERENCE})
RESPONSES = Dialect(
    "openai-responses",
    {"/v1/responses": Kind.INFERENCE, "/v1/responses/input_tokens": Kind.CONTROL},
    opening=bodies.responses_opening,
    named_id=_previous_response,
    count_request=lambda body: ("/v1/responses/input_tokens", body),
    read_usage=meter.responses_usage,
    read_id=meter.responses_id,
    output_fields=("max_output_tokens",),
)
ANTHROPIC = Dialect(
    "anthropic-messages",
    {"/v1/messages": Kind.INFERENCE, "/v1/messages/count_tokens": Kind.CONTROL},
    opening=bodies.chat_opening,
    count_request=lambda body: ("/v1/messages/count_tokens", body),
    read_usage=meter.anthropic_usage,
    read_id=meter.anthropic_id,
    errors=ErrorShape.ANTHROPIC,
    output_fields=("max_tokens",),
)
LLAMA_CONTROL = Dialect(
    "llama-control",
    {
        path: Kind.CONTROL
        for path in (
            "/slots",
            "/props",
            "/tokenize",
            "/detokenize",
            "/apply-template",
            "/lora-adapters",
            "/metrics",
        )
    },
    opening=_chat_or_prompt,
    raw_prompt=bodies.raw_prompt,
    array_bodies=frozenset({"/lora-adapters"}),
)
CROSSBAR = Dialect(
    "crossbar",
    {"/v1/models": Kind.MODELS, "/models": Kind.MODELS, "/health": Kind.HEALTH},
)
DIALECTS = (
    OPENAI_CHAT,
    OPENAI_COMPLETIONS,
    LLAMA_COMPLETION,
    EMBEDDINGS,
    RERANK,
    RESPONSES,
    ANTHROPIC,
    LLAMA_CONTROL,
    CROSSBAR,
)

_BY_PATH: dict[str, tuple[Dialect, Kind]] = {
    path: (d, kind) for d in DIALECTS for path, kind in d.paths.items()
}
_SLOT = re.compile(r"/slots/\d+")
_BATCH_API = re.compile(r"/v1/(?:files|batches)(?:/[^/]+(?:/[a-z]+)?)?")
_ANSWERED = (Kind.MODELS, Kind.HEALTH)


def classify(method: str, path: str) -> tuple[Dialect, Kind | None]:
    """The dialect of a llama-server path and what crossbar does with it; the kind is None
    for a path crossbar does not serve (the dialect still says how to word the 404)."""
    found = _BY_PATH.get(path)
    if found is not None:
        dialect, kind = found
        if kind is Kind.INFERENCE and method != "POST":
            return dialect, Kind.CONTROL  # OPTIONS, GET...: passed on, no slot, no lease
        if kind not in _ANSWERED or method == "GET":
            return dialect, kind
        return dialect, None
    if _SLOT.fullmatch(path):
        return LLAMA_CONTROL, Kind.CONTROL
    if _BATCH_API.fullmatch(path):
        return OPENAI_CHAT, Kind.BATCHES
    return for_errors(path), None


def for_errors(path: str) -> Dialect:
    """The dialect whose error shape a client of `path` expects (Anthropic's under
    /v1/messages, OpenAI's elsewhere)."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return ANTHROPIC
    return OPENAI_CHAT
