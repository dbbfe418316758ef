"""The shapes of the fake's inference answers, after llama-server's (tools/server).

One formatter per API: OpenAI chat, OpenAI completions, llama.cpp's native `/completion`, and
the OpenAI Responses API. Each gives the SSE events of a stream (`begin`, one per `token`,
`end`) and the JSON body of a non-streaming answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from attrs import define, field

FINGERPRINT = "b0-crossbar-fakellama"

Event = tuple[Any, str | None]  # (data, SSE event name)


@define
class Job:
    """One inference request, parsed."""

    kind: str  # "chat", "cmpl", "native", "responses", "anthropic"
    path: str
    id: str
    model: str
    prompt: list[int]
    stream: bool
    n_predict: int  # tokens to generate at most
    limited: bool  # the client set the limit (reaching it is finish_reason "length")
    id_slot: int | None = None
    use_cache: bool = True
    messages: list[dict[str, Any]] | None = None  # chat-shaped prompt, for Responses chaining
    created: int = 0
    slot: int = -1
    cache_n: int = 0  # prompt tokens the slot's cache held, known once the job has a slot
    item_id: str = ""  # Responses: the output message's id
    include_usage: bool = False  # chat streams: `stream_options.include_usage`
    tool_call: Any = None  # faketools.ToolCall: the reply is this call instead of text
    # chat, Anthropic: the trailing assistant message continued, echoed at the answer's start
    prefix: str = ""
    reply: Iterator[str] = field(factory=lambda: iter(()))  # the pieces to generate, in order
    seq: int = field(default=0)  # Responses: sequence_number of the next event


@define
class Outcome:
    """How a finished generation went."""

    text: str
    n_predicted: int
    stopped_by_limit: bool
    cache_n: int
    prompt_n: int
    prompt_ms: float
    predicted_ms: float


def timings(o: Outcome) -> dict[str, Any]:
    def per(ms: float, n: int) -> tuple[float, float]:
        return (round(ms / n, 3) if n else 0.0, round(1000.0 * n / ms, 3) if ms > 0 else 0.0)

    p_tok, p_sec = per(o.prompt_ms, o.prompt_n)
    g_tok, g_sec = per(o.predicted_ms, o.n_predicted)
    return {
        "cache_n": o.cache_n,
        "prompt_n": o.prompt_n,
        "prompt_ms": round(o.prompt_ms, 3),
        "prompt_per_token_ms": p_tok,
        "prompt_per_second": p_sec,
        "predicted_n": o.n_predicted,
        "predicted_ms": round(o.predicted_ms, 3),
        "predicted_per_token_ms": g_tok,
        "predicted_per_second": g_sec,
    }


def usage(job: Job, o: Outcome) -> dict[str, Any]:
    n = len(job.prompt)
    return {
        "completion_tokens": o.n_predicted,
        "prompt_tokens": n,
        "total_tokens": n + o.n_predicted,
        "prompt_tokens_details": {"cached_tokens": o.cache_n},
    }


def finish_reason(o: Outcome) -> str:
    return "length" if o.stopped_by_limit else "stop"


class Format:
    """Base: no stream preamble."""

    done_marker: ClassVar[bool] = True  # OpenAI-style streams end with `data: [DONE]`

    def begin(self, job: Job) -> list[Event]:
        return []

    def token(self, job: Job, piece: str, token: int, i: int) -> list[Event]:
        raise NotImplementedError

    def end(self, job: Job, o: Outcome) -> list[Event]:
        raise NotImplementedError

    def body(self, job: Job, o: Outcome) -> dict[str, Any]:
        raise NotImplementedError


class ChatFormat(Format):
    def _chunk(self, job: Job, choices: list[Any]) -> dict[str, Any]:
        return {
            "choices": choices,
            "created": job.created,
            "id": job.id,
            "model": job.model,
            "system_fingerprint": FINGERPRINT,
            "object": "chat.completion.chunk",
        }

    def begin(self, job: Job) -> list[Event]:
        delta = {"role": "assistant", "content": None}
        return [(self._chunk(job, [{"finish_reason": None, "index": 0, "delta": delta}]), None)]

    def token(self, job: Job, piece: str, token: int, i: int) -> list[Event]:
        delta = {"content": job.prefix + piece if i == 0 else piece}
        return [(self._chunk(job, [{"finish_reason": None, "index": 0, "delta": delta}]), None)]

    def end(self, job: Job, o: Outcome) -> list[Event]:
        last = self._chunk(job, [{"finish_reason": finish_reason(o), "index": 0, "delta": {}}])
        chunks = [last]
        if job.include_usage:  # asked for: a last chunk with no choices carries the usage
            chunks.append(self._chunk(job, []) | {"usage": usage(job, o)})
        chunks[-1]["timings"] = timings(o)  # llama-server times the last chunk either way
        return [(chunk, None) for chunk in chunks]

    def body(self, job: Job, o: Outcome) -> dict[str, Any]:
        choice = {
            "finish_reason": finish_reason(o),
            "index": 0,
            "message": {"role": "assistant", "content": job.prefix + o.text},
        }
        return {
            "choices": [choice],
            "created": job.created,
            "model": job.model,
            "system_fingerprint": FINGERPRINT,
            "object": "chat.completion",
            "usage": usage(job, o),
            "id": job.id,
            "timings": timings(o),
        }


class CompletionsFormat(Format):
    """OpenAI `/v1/completions`."""

    def _chunk(self, job: Job, text: str, reason: str | None) -> dict[str, Any]:
        return {
            "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": reason}],
            "created": job.created,
            "model": job.model,
            "system_fingerprint": FINGERPRINT,
            "object": "text_completion",
            "id": job.id,
        }

    def token(self, job: Job, piece: str, token: int, i: int) -> list[Event]:
        return [(self._chunk(job, piece, None), None)]

    def end(self, job: Job, o: Outcome) -> list[Event]:
        last = self._chunk(job, "", finish_reason(o))
        return [(last | {"usage": usage(job, o), "timings": timings(o)}, None)]

    def body(self, job: Job, o: Outcome) -> dict[str, Any]:
        return self._chunk(job, o.text, finish_reason(o)) | {
            "usage": usage(job, o),
            "timings": timings(o),
        }


class NativeFormat(Format):
    """llama.cpp's own `/completion` (no `[DONE]`, no OpenAI ids)."""

    done_marker = False

    def token(self, job: Job, piece: str, token: int, i: int) -> list[Event]:
        chunk = {
            "index": 0,
            "content": piece,
            "tokens": [token],
            "stop": False,
            "id_slot": job.slot,
            "tokens_predicted": i + 1,
            "tokens_evaluated": len(job.prompt),
        }
        return [(chunk, None)]

    def end(self, job: Job, o: Outcome) -> list[Event]:
        return [(self.body(job, o) | {"content": ""}, None)]

    def body(self, job: Job, o: Outcome) -> dict[str, Any]:
        return {
            "index": 0,
            "content": o.text,
            "tokens": [],
            "id_slot": job.slot,
            "stop": True,
            "model": job.model,
            "tokens_predicted": o.n_predicted,
            "tokens_evaluated": len(job.prompt),
            "generation_settings": {"n_predict": job.n_predict if job.limited else -1},
            "prompt": "",
            "has_new_line": "\n" in o.text,
            "truncated": False,
            "stop_type": "limit" if o.stopped_by_limit else "eos",
            "stopping_word": "",
            "tokens_cached": o.cache_n,
            "timings": timings(o),
        }


class ResponsesFormat(Format):
    """OpenAI `/v1/responses`: `event:` + `data:` pairs, no `[DONE]`."""

    done_marker = False

    def _event(self, job: Job, kind: str, **data: Any) -> Event:
        job.seq += 1
        return ({"type": kind, "sequence_number": job.seq - 1, **data}, kind)

    def _response(self, job: Job, status: str, output: list[Any]) -> dict[str, Any]:
        return {
            "id": job.id,
            "object": "response",
            "created_at": job.created,
            "status": status,
            "model": job.model,
            "output": output,
        }

    def _message(self, job: Job, text: str, status: str) -> dict[str, Any]:
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
        return {
            "id": job.item_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": [part] if status == "completed" else [],
        }

    def _usage(self, job: Job, o: Outcome) -> dict[str, Any]:
        n = len(job.prompt)
        return {
            "input_tokens": n,
            "output_tokens": o.n_predicted,
            "total_tokens": n + o.n_predicted,
            "input_tokens_details": {"cached_tokens": o.cache_n},
            "output_tokens_details": {"reasoning_tokens": 0},
        }

    def begin(self, job: Job) -> list[Event]:
        where = {"item_id": job.item_id, "output_index": 0, "content_index": 0}
        part = {"type": "output_text", "annotations": [], "text": ""}
        return [
            self._event(job, "response.created", response=self._response(job, "in_progress", [])),
            self._event(
                job, "response.in_progress", response=self._response(job, "in_progress", [])
            ),
            self._event(
                job,
                "response.output_item.added",
                output_index=0,
                item=self._message(job, "", "in_progress"),
            ),
            self._event(job, "response.content_part.added", **where, part=part),
        ]

    def token(self, job: Job, piece: str, token: int, i: int) -> list[Event]:
        where = {"item_id": job.item_id, "output_index": 0, "content_index": 0}
        return [self._event(job, "response.output_text.delta", **where, delta=piece, logprobs=[])]

    def end(self, job: Job, o: Outcome) -> list[Event]:
        where = {"item_id": job.item_id, "output_index": 0, "content_index": 0}
        item = self._message(job, o.text, "completed")
        done = self.body(job, o)
        return [
            self._event(job, "response.output_text.done", **where, text=o.text, logprobs=[]),
            self._event(job, "response.content_part.done", **where, part=item["content"][0]),
            self._event(job, "response.output_item.done", output_index=0, item=item),
            self._event(job, "response.completed", response=done, timings=timings(o)),
        ]

    def body(self, job: Job, o: Outcome) -> dict[str, Any]:
        output = [self._message(job, o.text, "completed")]
        return self._response(job, "completed", output) | {
            "completed_at": job.created,
            "usage": self._usage(job, o),
            "timings": timings(o),
        }


FORMATS: dict[str, Format] = {
    "chat": ChatFormat(),
    "cmpl": CompletionsFormat(),
    "native": NativeFormat(),
    "responses": ResponsesFormat(),
}
