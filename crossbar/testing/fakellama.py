"""A fake llama-server for tests, the smoke run, the demo and the benchmarks.

It behaves like llama.cpp's `llama-server` where crossbar can see it: health while loading,
props and slots, OpenAI-style and native completions (JSON and SSE, with `usage` and
`timings`), a modelled prompt cache with truthful `cache_n`/`prompt_n`, and fault switches.

    fake = FakeLlama(reactor, parallel=1, tokens_per_second=20)
    await fake.start()          # port 0: fake.port / fake.url say where
    fake.faults.error_500 = True
    ...
    await fake.stop()
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import islice
from typing import Any

from attrs import evolve
from twisted.internet.defer import Deferred, DeferredLock, succeed
from twisted.internet.interfaces import IDelayedCall, IListeningPort
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.web.http import HTTPChannel
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from crossbar.testing.fakeapi import FakeApi
from crossbar.testing.fakecache import PromptCache
from crossbar.testing.fakestate import Completion, Counters, FakeConfig, Faults
from crossbar.testing.faketokens import Tokenizer, answer_pieces, continued_text, render_chat

__all__ = ["Completion", "Counters", "FakeConfig", "FakeLlama", "Faults"]

log = Logger()

# Responses-API conversations kept for `previous_response_id`; oldest forgotten first.
_REMEMBER_RESPONSES = 10_000


class _Connections(WrappingFactory):
    """Knows every open connection, so a dead host (refuse, stop) can drop them all."""

    def __init__(self, wrapped: Site) -> None:
        super().__init__(wrapped)
        self._closed: list[Deferred[None]] = []

    def unregisterProtocol(self, p: ProtocolWrapper) -> None:
        super().unregisterProtocol(p)
        if not self.protocols:
            waiting, self._closed = self._closed, []
            for d in waiting:
                d.callback(None)

    def drop(self, spare: object = None) -> None:
        """Reset every connection; `spare` (one that must finish its answer) closes after
        flushing instead."""
        for p in list(self.protocols):
            if p is spare:
                p.loseConnection()
            else:
                p.transport.abortConnection()

    def all_closed(self) -> Deferred[None]:
        if not self.protocols:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._closed.append(d)
        return d


class _ControlOnly(Resource):
    """The fake's `/_fake/*` paths only: its control port, which `refuse` leaves open."""

    isLeaf = True

    def __init__(self, api: FakeApi) -> None:
        super().__init__()
        self._api = api

    def render(self, request: Request) -> object:
        if request.path.startswith(b"/_fake/"):
            return self._api.render(request)
        request.setResponseCode(404)
        return b"the control port serves /_fake/* only\n"


class FakeLlama:
    """One fake llama-server; see the module docstring. `reactor` provides TCP and time."""

    def __init__(self, reactor: Any, config: FakeConfig | None = None, **overrides: Any) -> None:
        self.reactor = reactor
        self.config = evolve(config or FakeConfig(), **overrides)
        self.faults = Faults()
        self.faults.follow_refuse(self._refuse_changed)
        self.counters = Counters()
        self.tokenizer = Tokenizer()
        self.cache = PromptCache(self.config.parallel, self.config.cache_slots)
        self.running: dict[str, str] = {}  # completion id -> path, while it runs
        self.conversations: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self.saved_slots: dict[str, list[int]] = {}  # POST /slots/<id>?action=save
        self.port = 0
        self.url = ""
        self.started_at = 0.0
        self.api = FakeApi(self)
        site = Site(self.api, reactor=reactor, timeout=None)
        site.protocol = HTTPChannel  # HTTP/1.1 only, as llama-server; its producer is at hand
        self._connections = _Connections(site)
        self._listener: IListeningPort | None = None
        self._control: IListeningPort | None = None
        self.control_url = ""  # the control port's URL, when one was asked for
        self._interface = "127.0.0.1"
        self._lock = DeferredLock()  # listener changes happen one at a time, in order
        self._load_timer: IDelayedCall | None = None
        self._load_waiters: list[Deferred[None]] = []
        self._timers: list[IDelayedCall] = []
        self._spare: object = None
        self._stopped = False

    @property
    def factory(self) -> WrappingFactory:
        """The factory of its HTTP connections: serve the fake without a port (an in-memory
        network's host, its `reactor` a Clock) by building protocols from it."""
        return self._connections

    @property
    def loading(self) -> bool:
        """True while the load delay runs or the `loading` fault is on."""
        return self.faults.loading or self._load_timer is not None

    async def start(
        self, port: int = 0, interface: str = "127.0.0.1", control_port: int | None = None
    ) -> None:
        """Listen on `interface:port` (0: any free port; `port` and `url` tell which), and
        with `control_port` on a second port serving only `/_fake/*` (`control_url`), which
        stays open while `refuse` closes the first."""
        self._interface = interface
        self._listener = self.reactor.listenTCP(port, self._connections, interface=interface)
        self.port = self._listener.getHost().port
        host = f"[{interface}]" if ":" in interface else interface
        self.url = f"http://{host}:{self.port}"
        if control_port is not None:
            site = Site(_ControlOnly(self.api), reactor=self.reactor)
            site.noisy = False
            self._control = self.reactor.listenTCP(control_port, site, interface=interface)
            self.control_url = f"http://{host}:{self._control.getHost().port}"
        self.started_at = self.reactor.seconds()
        if self.config.load_delay > 0:
            self._load_timer = self.reactor.callLater(self.config.load_delay, self._loaded)
        if self.faults.refuse:
            await self._lock.run(self._set_listening, False)

    async def stop(self) -> None:
        """Close the listener and drop every open connection; in-flight work is cancelled."""
        self._stopped = True
        for timer in [self._load_timer, *self._timers]:
            if timer is not None and timer.active():
                timer.cancel()
        self._timers = []
        self._loaded()  # nobody waits on a load that will never end
        await self._lock.run(self._set_listening, False)
        if self._control is not None:
            await self._control.stopListening()
            self._control = None
        await self._connections.all_closed()

    def settle(self) -> Deferred[None]:
        """Fires once the listener follows the `refuse` switch (it changes asynchronously)."""

        def release(_: object) -> None:
            self._lock.release()

        return self._lock.acquire().addCallback(release)

    def refuse_for(self, seconds: float) -> None:
        """Refuse now and listen again after `seconds` (a host that restarts)."""
        self.faults.refuse = True
        self._timers = [t for t in self._timers if t.active()]
        self._timers.append(self.reactor.callLater(seconds, setattr, self.faults, "refuse", False))

    def spare_connection(self, request: Request | None) -> None:
        """Let `request`'s connection finish its answer when `refuse` next drops the others."""
        channel = request.channel if request is not None else None
        self._spare = channel.transport if channel is not None else None

    def chat_prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        """The prompt tokens of a chat request for `messages`."""
        prefill = self.config.prefill_assistant
        return self.tokenizer.tokenize(render_chat(messages, prefill=prefill))

    def reply(
        self,
        messages: list[dict[str, Any]] | None = None,
        prompt: str | list[int] | None = None,
        max_tokens: int | None = None,
    ) -> str:
        """The text the fake answers to chat `messages` or to a raw `prompt`; when it continues
        a trailing assistant message, only what follows it (the answer echoes it first)."""
        prefix = None
        if messages is not None:
            tokens = self.chat_prompt(messages)
            prefix = continued_text(messages) if self.config.prefill_assistant else None
        elif isinstance(prompt, str):
            tokens = self.tokenizer.tokenize(prompt)
        elif prompt is not None:
            tokens = list(prompt)
        else:
            raise ValueError("give messages or prompt")
        n = self.config.reply_tokens if max_tokens is None else max_tokens
        pieces, _ = answer_pieces(tokens, prefix)
        return "".join(islice(pieces, min(n, self.config.ctx - len(tokens))))

    def remember(self, response_id: str, conversation: list[dict[str, Any]]) -> None:
        """Keep a Responses-API conversation (prompt messages + reply) for chaining."""
        self.conversations[response_id] = conversation
        while len(self.conversations) > _REMEMBER_RESPONSES:
            self.conversations.popitem(last=False)

    def record(self, completion: Completion) -> None:
        self.counters.completions.append(completion)

    def when_loaded(self) -> Deferred[None]:
        """Fires when the load delay is over (at once if it is); the `loading` fault aside."""
        if self._load_timer is None:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._load_waiters.append(d)
        return d

    def finish_loading(self) -> None:
        """End the load delay now, as if it had run out (a test need not wait it out)."""
        if self._load_timer is not None and self._load_timer.active():
            self._load_timer.cancel()
        self._loaded()

    def _loaded(self) -> None:
        self._load_timer = None
        waiting, self._load_waiters = self._load_waiters, []
        for d in waiting:
            d.callback(None)

    def _refuse_changed(self, refuse: bool) -> None:
        if self._listener is None and not self.port:
            return  # not started: start() applies the switch
        self._lock.run(self._set_listening, not refuse).addErrback(
            lambda f: log.failure("fakellama: changing the listener failed", f)
        )

    async def _set_listening(self, listen: bool) -> None:
        if listen:
            if self._listener is None and not self._stopped:
                # The same port again, so crossbar's configured URL still points here.
                self._listener = self.reactor.listenTCP(
                    self.port, self._connections, interface=self._interface
                )
            return
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.stopListening()
        self.api.mark_all_dropped(spare=self._spare)
        self._connections.drop(spare=self._spare)
        self._spare = None
