"""The fake llama-server's HTTP resource: routing, the control endpoints and `/_fake/`."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from crossbar.testing.fakeanthropic import anthropic_messages
from crossbar.testing.fakegen import KINDS, infer
from crossbar.testing.fakehttp import (
    ApiError,
    bad_request,
    loading_error,
    not_found,
    read_json_object,
    send_json,
    send_text,
)
from crossbar.testing.fakestate import Fake
from crossbar.testing.faketokens import render_chat, responses_messages

log = Logger()

_SLOT_PATH = re.compile(r"^/slots/(\d+)$")
_Handler = Callable[[Request, dict[str, Any]], Awaitable[None]]


class FakeApi(Resource):
    """Every path of the fake; each request runs as a coroutine that a client disconnect
    cancels (that is how `aborted` is counted and a slot freed at once)."""

    isLeaf = True

    def __init__(self, fake: Fake) -> None:
        super().__init__()
        self._fake = fake
        self._active: dict[Request, Deferred[None]] = {}
        self._dropped: set[Request] = set()
        self._get: dict[str, Callable[[Request], Any]] = {
            "/health": self._health,
            "/v1/health": self._health,
            "/props": self._props,
            "/slots": self._slots,
            "/v1/models": self._models,
            "/models": self._models,
            "/metrics": self._metrics,
        }
        self._post: dict[str, _Handler] = {
            "/tokenize": self._tokenize,
            "/detokenize": self._detokenize,
            "/apply-template": self._apply_template,
            "/v1/chat/completions/input_tokens": self._input_tokens,
            "/v1/responses/input_tokens": self._input_tokens,
            "/v1/messages/count_tokens": self._input_tokens,
            "/v1/chat/completions/control": self._control,
        }

    def render(self, request: Request) -> object:
        path = request.path.decode("utf-8", "replace")
        if not path.startswith("/_fake/"):
            counters = self._fake.counters
            counters.requests[path] += 1
            counters.seen.append((path, request.requestHeaders))  # kept as is: no copy
        # llama-server's default CORS: every origin, and OPTIONS answered before anything else.
        request.setHeader(b"access-control-allow-origin", b"*")
        if request.method == b"OPTIONS":
            request.setHeader(b"access-control-allow-credentials", b"false")
            request.setHeader(b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS")
            request.setHeader(b"access-control-allow-headers", b"*")
            send_text(request, "", b"text/html")
            return NOT_DONE_YET
        d = Deferred.fromCoroutine(self._respond(request, path))
        self._active[request] = d
        request.notifyFinish().addErrback(self._lost, request, d)
        d.addErrback(self._failed, request)
        d.addBoth(self._done, request)
        return NOT_DONE_YET

    def drop(self, request: Request, reset: bool = False) -> None:
        """Cut `request`'s connection on purpose: closed after what was written is flushed, or
        with `reset` at once by a TCP reset (which drops what Twisted still buffers)."""
        self._dropped.add(request)
        self._fake.counters.dropped += 1
        transport = request.channel.transport if request.channel is not None else None
        if transport is None:
            return
        if reset:
            transport.abortConnection()  # SO_LINGER 0, then close: the peer gets an RST
        else:
            transport.loseConnection()

    def mark_all_dropped(self, spare: object = None) -> None:
        """Every open request is about to be cut by the fake itself (refuse, stop)."""
        for request in self._active:
            if request.channel is None or request.channel.transport is not spare:
                self._dropped.add(request)
                self._fake.counters.dropped += 1

    def _lost(self, reason: Failure, request: Request, d: Deferred[None]) -> None:
        if request in self._dropped:
            self._dropped.discard(request)
        else:
            self._fake.counters.aborted += 1
        d.cancel()

    def _failed(self, failure: Failure, request: Request) -> None:
        if failure.check(CancelledError):
            return
        log.failure("fakellama: {path} failed", failure, path=request.path)
        if not request.finished and request.channel is not None and not request.startedWriting:
            send_json(request, ApiError(500, "fake failed", "server_error").body(), 500)

    def _done(self, _: object, request: Request) -> None:
        # A dropped request stays in _dropped until its connectionLost reaches _lost.
        self._active.pop(request, None)

    async def _respond(self, request: Request, path: str) -> None:
        try:
            await self._dispatch(request, path, request.method.decode())
        except ApiError as e:
            send_json(request, e.body(), e.status)

    async def _dispatch(self, request: Request, path: str, method: str) -> None:
        fake = self._fake
        if path.startswith("/_fake/"):
            await self._fake_path(request, path, method)
            return
        if fake.loading:
            raise loading_error()
        if not self._authorized(request, path):
            # llama-server's own answer, after its loading check as there.
            raise ApiError(401, "Invalid API Key", "authentication_error")
        if method == "GET" and path in self._get:
            self._get[path](request)
        elif method == "POST" and path in KINDS:
            await infer(fake, request, path, read_json_object(request))
        elif method == "POST" and path in self._post:
            await self._post[path](request, read_json_object(request))
        elif method == "POST" and (m := _SLOT_PATH.match(path)):
            await self._slot_action(request, int(m.group(1)))
        else:
            raise not_found()

    def _authorized(self, request: Request, path: str) -> bool:
        key = self._fake.config.api_key
        if not key or path in ("/health", "/v1/health"):
            return True
        sent = request.getHeader("authorization") or request.getHeader("x-api-key") or ""
        return sent.removeprefix("Bearer ") == key

    def _health(self, request: Request) -> None:
        send_json(request, {"status": "ok"})

    def _generation_settings(self, slot: int = 0, task: int = -1, busy: bool = False) -> Any:
        return {
            "id": slot,
            "id_task": task,
            "n_ctx": self._fake.config.ctx,
            "speculative": False,
            "is_processing": busy,
            "params": {"n_predict": -1, "max_tokens": -1, "stream": True},
            "next_token": {"has_next_token": busy, "n_remain": -1, "n_decoded": 0},
        }

    def _props(self, request: Request) -> None:
        config = self._fake.config
        send_json(
            request,
            {
                "default_generation_settings": self._generation_settings(),
                "total_slots": config.parallel,
                "model_path": f"/models/{config.models[0]}.gguf",
                "model_alias": config.models[0],
                "chat_template": "chatml (crossbar fakellama)",
                "modalities": {"vision": False, "audio": False},
                "build_info": "crossbar-fakellama",
                "is_sleeping": False,
            },
        )

    def _slots(self, request: Request) -> None:
        cache = self._fake.cache
        if request.args.get(b"fail_on_no_slot") and cache.busy == len(cache.slots):
            raise ApiError(503, "no slot available", "unavailable_error")
        body = [self._generation_settings(s.id, s.id_task, s.busy) for s in cache.slots]
        send_json(request, body)

    def _models(self, request: Request) -> None:
        created = int(self._fake.started_at)
        data = [
            {"id": m, "object": "model", "created": created, "owned_by": "llamacpp", "meta": None}
            for m in self._fake.config.models
        ]
        send_json(request, {"object": "list", "data": data})

    def _metrics(self, request: Request) -> None:
        c, cache = self._fake.counters, self._fake.cache
        high = max((len(s.tokens) for s in cache.slots), default=0)
        rows = [
            ("prompt_tokens_total", "counter", "Prompt tokens processed.", c.prefill_tokens),
            ("tokens_predicted_total", "counter", "Generation tokens.", c.predicted_tokens),
            ("requests_processing", "gauge", "Requests processing.", cache.busy),
            ("requests_deferred", "gauge", "Requests deferred.", cache.queued),
            ("n_tokens_max", "counter", "High watermark of the context size.", high),
        ]
        lines = []
        for name, kind, help_, value in rows:
            lines += [
                f"# HELP llamacpp:{name} {help_}",
                f"# TYPE llamacpp:{name} {kind}",
                f"llamacpp:{name} {value}",
            ]
        send_text(request, "\n".join(lines) + "\n", b"text/plain; version=0.0.4")

    async def _tokenize(self, request: Request, body: dict[str, Any]) -> None:
        content = body.get("content")
        if not isinstance(content, str):
            raise bad_request("'content' must be a string")
        tokens = self._fake.tokenizer.tokenize(content)
        if body.get("with_pieces"):
            tok = self._fake.tokenizer
            send_json(request, {"tokens": [{"id": t, "piece": tok.piece(t)} for t in tokens]})
        else:
            send_json(request, {"tokens": tokens})

    async def _detokenize(self, request: Request, body: dict[str, Any]) -> None:
        tokens = body.get("tokens", [])
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            raise bad_request("'tokens' must be an array of integers")
        send_json(request, {"content": self._fake.tokenizer.detokenize(tokens)})

    def _render(self, request: Request, body: dict[str, Any]) -> str:
        try:
            if request.path == b"/v1/responses/input_tokens":
                messages = responses_messages(body.get("instructions"), body.get("input"))
                return render_chat(messages)
            if request.path == b"/v1/messages/count_tokens":
                messages = anthropic_messages(body.get("system"), body.get("messages"))
            else:
                messages = body.get("messages")
            # As inference renders it: a trailing assistant message left open to continue.
            return render_chat(messages, prefill=self._fake.config.prefill_assistant)
        except ValueError as e:
            raise bad_request(str(e)) from None

    async def _apply_template(self, request: Request, body: dict[str, Any]) -> None:
        send_json(request, {"prompt": self._render(request, body)})

    async def _input_tokens(self, request: Request, body: dict[str, Any]) -> None:
        n = len(self._fake.tokenizer.tokenize(self._render(request, body)))
        send_json(request, {"input_tokens": n})

    async def _control(self, request: Request, body: dict[str, Any]) -> None:
        if body.get("id") in self._fake.running:
            send_json(request, {"success": True})
        else:
            send_json(request, {"success": False, "message": "no running completion has this id"})

    async def _slot_action(self, request: Request, id_slot: int) -> None:
        fake = self._fake
        action = (request.args.get(b"action") or [b""])[0].decode()
        if action not in ("save", "restore", "erase"):
            raise bad_request("Invalid action: use save, restore or erase")
        if not 0 <= id_slot < len(fake.cache.slots):
            raise bad_request("Invalid slot ID")
        body = read_json_object(request)
        filename = body.get("filename", "")
        if action != "erase" and (not isinstance(filename, str) or not filename):
            raise bad_request("'filename' is required")
        # Like llama-server, a slot action on a busy slot waits for the slot.
        slot = (await fake.cache.claim(None, id_slot)).slot
        try:
            answer: dict[str, Any] = {"id_slot": id_slot}
            if action == "erase":
                answer["n_erased"] = fake.cache.erase(slot)
            elif action == "save":
                fake.saved_slots[filename] = list(slot.tokens)
                n = len(slot.tokens)
                answer |= {"filename": filename, "n_saved": n, "n_written": n * 4}
                answer["timings"] = {"save_ms": 0.0}
            elif filename in fake.saved_slots:
                slot.tokens = list(fake.saved_slots[filename])
                n = len(slot.tokens)
                answer |= {"filename": filename, "n_restored": n, "n_read": n * 4}
                answer["timings"] = {"restore_ms": 0.0}
            else:
                raise bad_request(
                    "Unable to restore slot, no available space in KV cache "
                    "or invalid slot save file"
                )
        finally:
            fake.cache.release(slot)
        send_json(request, answer)

    async def _fake_path(self, request: Request, path: str, method: str) -> None:
        fake = self._fake
        if path == "/_fake/counters" and method == "GET":
            send_json(request, fake.counters.as_dict() | {"cache": fake.cache.describe()})
        elif path == "/_fake/faults" and method == "GET":
            send_json(request, fake.faults.as_dict())
        elif path == "/_fake/faults" and method == "POST":
            changes = read_json_object(request)
            refuse_for = changes.pop("refuse_for", None)
            if refuse_for is not None and (
                not isinstance(refuse_for, (int, float)) or refuse_for <= 0
            ):
                raise bad_request("'refuse_for' must be a positive number of seconds")
            # This answer must get out before a refuse drops the connections.
            fake.spare_connection(request)
            try:
                fake.faults.update(changes)  # validates everything before changing anything
            except ValueError as e:
                fake.spare_connection(None)
                raise bad_request(str(e)) from None
            send_json(request, fake.faults.as_dict())
            if refuse_for is not None:
                fake.refuse_for(refuse_for)
        else:
            raise not_found()
