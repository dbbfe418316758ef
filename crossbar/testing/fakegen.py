"""Inference in the fake llama-server: parse, wait for a slot, prefill, generate, answer."""

from __future__ import annotations

import json
import secrets
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IPushProducer
from twisted.internet.task import deferLater
from twisted.web.server import Request
from zope.interface import implementer

from crossbar.testing.fakeanthropic import AnthropicFormat, anthropic_messages
from crossbar.testing.fakeformat import FORMATS, Format, Job, Outcome
from crossbar.testing.fakehttp import (
    ApiError,
    bad_request,
    busy_error,
    send_json,
    server_error,
    sse_event,
)
from crossbar.testing.fakestate import Completion, Fake
from crossbar.testing.faketokens import (
    answer_pieces,
    continued_text,
    render_chat,
    responses_messages,
    split_pieces,
)
from crossbar.testing.faketools import TOOL_FORMATS, planned_call

KINDS = {
    "/v1/chat/completions": "chat",
    "/chat/completions": "chat",
    "/v1/completions": "cmpl",
    "/completions": "cmpl",
    "/completion": "native",
    "/v1/responses": "responses",
    "/v1/messages": "anthropic",
}
# llama-server names an Anthropic message with a chat completion id too.
_ID_PREFIX = {
    "chat": "chatcmpl-",
    "cmpl": "cmpl-",
    "native": "cmpl-",
    "responses": "resp_",
    "anthropic": "chatcmpl-",
}
_FORMATS: dict[str, Format] = {**FORMATS, "anthropic": AnthropicFormat()}
# Which body keys limit the reply, per kind, in order of preference. As llama-server reads
# them: `n_predict` first on every endpoint (its aliases max_completion_tokens and max_tokens
# after it); 0 means "evaluate the prompt into the cache, generate nothing" (a prewarm).
_LIMIT_KEYS = {
    "chat": ("n_predict", "max_completion_tokens", "max_tokens"),
    "cmpl": ("n_predict", "max_completion_tokens", "max_tokens"),
    "native": ("n_predict", "max_completion_tokens", "max_tokens"),
    "responses": ("n_predict", "max_output_tokens", "max_tokens"),
    "anthropic": ("n_predict", "max_tokens"),
}
# The kinds whose trailing assistant message the fake continues (Responses: not yet).
_PREFILLED = ("chat", "anthropic")


# The mid-stream faults, in the order they are checked.
_CUTS = ("drop_after_chunks", "reset_after_chunks", "stall_after_chunks")


def _due(after: int | None, sent: int) -> bool:
    return after is not None and sent >= after


class Dropped(Exception):
    """The fake cut the connection on purpose (drop_after_chunks, reset_after_chunks)."""


def _prompt_tokens(fake: Fake, prompt: Any) -> list[int]:
    """A raw prompt: a string, token ids, strings and ids mixed, or one of those in a list."""
    if isinstance(prompt, str):
        return fake.tokenizer.tokenize(prompt)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        return _prompt_tokens(fake, prompt[0])
    if isinstance(prompt, list) and prompt:
        tokens: list[int] = []
        for part in prompt:
            if isinstance(part, str):
                tokens += fake.tokenizer.tokenize(part)
            elif type(part) is int:
                tokens.append(part)
            else:
                raise bad_request("the fake takes one prompt: a string or an array of tokens")
        return tokens
    raise bad_request("'prompt' must be a non-empty string or array of tokens")


def _messages(fake: Fake, kind: str, body: dict[str, Any]) -> list[dict[str, Any]] | None:
    if kind == "chat":
        return body.get("messages")  # type: ignore[no-any-return]
    if kind == "anthropic":
        return anthropic_messages(body.get("system"), body.get("messages"))
    if kind != "responses":
        return None
    previous = body.get("previous_response_id")
    prior: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if previous is not None:
        if not fake.config.keep_responses:
            raise bad_request("llama.cpp does not support 'previous_response_id'.")
        if previous not in fake.conversations:
            raise bad_request(f"previous response with id '{previous}' not found")
        # A chained turn extends the stored conversation, so it shares its prefix (and its
        # cache); instructions were rendered at the start of the first turn.
        prior = fake.conversations[previous]
        instructions = None
    return prior + responses_messages(instructions, body.get("input"))


def parse_job(fake: Fake, path: str, body: dict[str, Any]) -> Job:
    """The request as a Job, or a 400 in llama-server's shape."""
    kind = KINDS[path]
    model = body.get("model") or fake.config.models[0]
    if not isinstance(model, str):
        raise bad_request("'model' must be a string")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean")
    prefix: str | None = None  # the trailing assistant message continued
    try:
        messages = _messages(fake, kind, body)
        if messages is not None:
            prefill = fake.config.prefill_assistant and kind in _PREFILLED
            prefix = continued_text(messages) if prefill else None
            prompt = fake.tokenizer.tokenize(render_chat(messages, prefill=prefill))
        else:
            prompt = _prompt_tokens(fake, body.get("prompt"))
    except ValueError as e:
        raise bad_request(str(e)) from None
    reply, held = answer_pieces(prompt, prefix)
    limit = next((body[k] for k in _LIMIT_KEYS[kind] if body.get(k) is not None), None)
    if limit is not None and (type(limit) is not int or limit < -1):
        raise bad_request("the token limit must be an integer")
    limited = limit is not None and limit >= 0
    n_predict = limit if limited else fake.config.reply_tokens
    ctx = fake.config.ctx
    if len(prompt) >= ctx:
        raise ApiError(
            400,
            f"request ({len(prompt)} tokens) exceeds the available context size "
            f"({ctx} tokens), try increasing it",
            "exceed_context_size_error",
            n_prompt_tokens=len(prompt),
            n_ctx=ctx,
        )
    call = planned_call(kind, body) if kind in TOOL_FORMATS else None
    eos = fake.config.eos_after
    if eos is not None:
        eos = max(eos - held, 0)  # a continued answer ends where the uncut one would have
    if call:  # the call is the whole reply, however long; EOS right after it
        eos = len(split_pieces(call.arguments))
        n_predict = n_predict if limited else eos
    if eos is not None and n_predict > eos:
        n_predict, limited = eos, False  # the model is done before its limit
    if n_predict > ctx - len(prompt):
        n_predict, limited = ctx - len(prompt), True  # the context fills up
    id_slot = body.get("id_slot", -1)
    if type(id_slot) is not int or not -1 <= id_slot < fake.config.parallel:
        raise bad_request(f"invalid id_slot {id_slot!r}")
    return Job(
        kind=kind,
        path=path,
        id=_ID_PREFIX[kind] + secrets.token_hex(12),
        model=model,
        prompt=prompt,
        stream=stream,
        n_predict=n_predict,
        limited=limited,
        id_slot=None if id_slot == -1 else id_slot,
        use_cache=body.get("cache_prompt", True) is not False,
        messages=messages,
        created=int(fake.reactor.seconds()),
        item_id="msg_" + secrets.token_hex(12),
        include_usage=_include_usage(body),
        tool_call=call,
        prefix=prefix or "",
        reply=iter(split_pieces(call.arguments)) if call else reply,
    )


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _sleep(fake: Fake, seconds: float) -> Deferred[None]:
    return deferLater(fake.reactor, seconds)


@implementer(IPushProducer)
class _Flow:
    """The client's back-pressure on a stream: `ready()` waits while the client's connection
    takes no more (as llama-server's generation waits on its HTTP writer)."""

    def __init__(self) -> None:
        self._paused = False
        self._waiting: list[Deferred[None]] = []

    def ready(self) -> Deferred[None]:
        if not self._paused:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._waiting.append(d)
        return d

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        waiting, self._waiting = self._waiting, []
        for d in waiting:
            d.callback(None)

    def stopProducing(self) -> None:
        pass  # the connection is going: the request's cancel stops generation


class _Output:
    """Writes one answer: SSE events as they come, or one JSON body; applies the mid-stream
    faults before every event; a stream waits while its client does not read."""

    def __init__(self, fake: Fake, request: Request, job: Job, fmt: Format) -> None:
        self._fake = fake
        self._request = request
        self._job = job
        self._fmt = fmt
        self.sent = 0
        self._flow: _Flow | None = None

    async def _gate(self) -> None:
        faults = self._fake.faults
        cut = next((c for c in _CUTS if _due(getattr(faults, c), self.sent)), None)
        if cut is None:
            return
        if faults.cut_once:
            setattr(faults, cut, None)  # here, so no other request can meet it meanwhile
        if cut == "stall_after_chunks":
            await Deferred()  # silent until the client leaves (which cancels this)
        if cut == "reset_after_chunks":
            await self._flushed()
        self._fake.api.drop(self._request, reset=cut == "reset_after_chunks")
        raise Dropped()

    async def _flushed(self) -> None:
        """Wait until what was written has left (a reset drops what Twisted still holds): while
        the client's connection takes no more, then one reactor turn, in which the transport
        writes out the rest."""
        if self._flow is not None:
            await self._flow.ready()
        await _sleep(self._fake, 0)

    async def _send(self, events: list[tuple[Any, str | None]]) -> None:
        for data, event in events:
            await self._gate()
            if self.sent == 0:
                self._request.setHeader(b"content-type", b"text/event-stream")
                self._request.setHeader(b"cache-control", b"no-cache")
                self._flow = _Flow()
                self._request.registerProducer(self._flow, True)
            if self._flow is not None:
                await self._flow.ready()
            self._request.write(sse_event(data, event))
            self.sent += 1
            self._fake.counters.chunks_sent += 1

    async def begin(self) -> None:
        if self._job.stream:
            await self._send(self._fmt.begin(self._job))

    async def token(self, piece: str, token: int, i: int) -> None:
        if self._job.stream:
            await self._send(self._fmt.token(self._job, piece, token, i))

    async def end(self, outcome: Outcome) -> None:
        report = self._fake.faults.report
        if not self._job.stream:
            await self._gate()
            send_json(self._request, _lie(self._fmt.body(self._job, outcome), report))
            return
        events = [(_lie(data, report), name) for data, name in self._fmt.end(self._job, outcome)]
        if self._fmt.done_marker:
            events.append(("[DONE]", None))
        await self._send(events)
        await self._gate()
        if self._flow is not None:
            self._request.unregisterProducer()
        self._request.finish()


def _lie(data: Any, report: dict[str, Any] | None) -> Any:
    """`data` (a body or an event) with the `report` fault's fields in its `usage` and
    `timings`, wherever the dialect keeps them (Anthropic's and Responses' wrap them)."""
    if not report or not isinstance(data, dict):
        return data
    for holder in (data, data.get("message"), data.get("response")):
        if isinstance(holder, dict):
            for name, fields in report.items():
                if isinstance(holder.get(name), dict):
                    holder[name] = {**holder[name], **fields}
    return data


async def infer(fake: Fake, request: Request, path: str, body: dict[str, Any]) -> None:
    """Answer one inference request (the caller maps ApiError to its error body)."""
    counters = fake.counters
    counters.in_flight += 1
    counters.peak_in_flight = max(counters.peak_in_flight, counters.in_flight)
    try:
        if fake.faults.hang:
            await Deferred()  # accepted, never answered; the client's leaving cancels this
        if fake.faults.error_500:
            raise server_error()
        if fake.faults.busy is not None:
            raise busy_error(fake.faults.busy)
        job = parse_job(fake, path, body)
        await _run(fake, request, job)
    finally:
        counters.in_flight -= 1


async def _run(fake: Fake, request: Request, job: Job) -> None:
    counters = fake.counters
    counters.queued += 1
    try:
        claim = await fake.cache.claim(job.prompt, job.id_slot, job.use_cache)
    finally:
        counters.queued -= 1
    job.slot, job.cache_n = claim.slot.id, claim.cache_n
    counters.prefill_tokens += claim.prompt_n
    counters.cached_tokens += claim.cache_n
    fake.running[job.id] = job.path
    out = _Output(fake, request, job, (TOOL_FORMATS if job.tool_call else _FORMATS)[job.kind])
    kv = job.prompt[: claim.cache_n]  # what the slot's cache holds if we stop now
    pieces: list[str] = []
    outcome = "aborted"
    config = fake.config
    start = fake.reactor.seconds()
    try:
        if config.prefill_ms_per_token > 0 and claim.prompt_n:
            await _sleep(fake, config.prefill_ms_per_token * claim.prompt_n / 1000)
        kv = list(job.prompt)
        prefilled = fake.reactor.seconds()
        await out.begin()
        gap = 1 / config.tokens_per_second if config.tokens_per_second else 0
        reply = job.reply
        for i in range(job.n_predict):
            # Every token costs a decode step (a reactor turn at least, so streams interleave
            # and each SSE event leaves on its own).
            await _sleep(fake, gap)
            piece = next(reply)
            (token,) = fake.tokenizer.ids([piece])
            pieces.append(piece)
            kv.append(token)
            counters.predicted_tokens += 1
            await out.token(piece, token, i)
        text = "".join(pieces)
        result = Outcome(
            text=text,
            n_predicted=len(pieces),
            stopped_by_limit=job.limited,
            cache_n=claim.cache_n,
            prompt_n=claim.prompt_n,
            prompt_ms=(prefilled - start) * 1000,
            predicted_ms=(fake.reactor.seconds() - prefilled) * 1000,
        )
        if job.kind == "responses" and job.messages is not None:
            fake.remember(job.id, [*job.messages, {"role": "assistant", "content": text}])
        await out.end(result)
        outcome = "done"
    except Dropped:
        outcome = "dropped"
    finally:
        fake.running.pop(job.id, None)
        fake.cache.release(claim.slot, kv)
        fake.record(
            Completion(
                id=job.id,
                path=job.path,
                model=job.model,
                slot=job.slot,
                stream=job.stream,
                prompt_tokens=len(job.prompt),
                cache_n=claim.cache_n,
                prompt_n=claim.prompt_n,
                completion_tokens=len(pieces),
                text="".join(pieces),
                outcome=outcome,
                opening=_opening(job.messages),
            )
        )


def _opening(messages: list[dict[str, Any]] | None) -> str:
    for message in messages or []:
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""
