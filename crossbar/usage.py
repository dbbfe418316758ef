"""One finished exchange becomes its usage row, its id memory and the guard's learning, each
done once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from attrs import define, field
from twisted.internet.defer import ensureDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from crossbar.guard import ContextGuard
from crossbar.ids import IdMemory
from crossbar.meter import Tokens
from crossbar.records import UsageRow

log = Logger(namespace="crossbar.usage")
Observer = Callable[[UsageRow], None]


class UsageStore(Protocol):
    """What the recorder needs of the store."""

    async def record_usage(self, row: UsageRow) -> None: ...


@define
class Exchange:
    """One request as the proxy learns it, step by step; only the proxy writes it."""

    started: float
    route: str = ""
    path: str = ""
    fp: str = ""
    model: str = ""
    host: str = ""
    lease: str = ""  # the X-Crossbar-Lease value: new, reused or pinned
    prompt_chars: int = 0  # for the guard's learned ratio
    queue_ms: float = 0.0
    status: int = 0
    stream: bool = False
    first_byte: float | None = None  # clock seconds of the first answer byte
    tokens: Tokens = field(factory=Tokens)
    error: str = ""


class UsageRecorder:
    """Turns finished exchanges into usage rows for the observers (the request log line,
    metrics) and the store, remembers completion ids with their host, and teaches the guard."""

    def __init__(
        self,
        store: UsageStore,
        ids: IdMemory,
        guard: ContextGuard,
        clock: IReactorTime,
        observers: list[Observer] | None = None,
    ) -> None:
        self._store = store
        self._ids = ids
        self._guard = guard
        self._clock = clock
        self.observers: list[Observer] = list(observers or [])

    def remember_id(self, id_: str, host: str, fp: str) -> None:
        """A completion or response id showed in an answer: side calls that name it go to
        `host` (called once per answer, as soon as the id shows)."""
        self._ids.remember([id_], host, fp, self._clock.seconds())

    def finish(self, ex: Exchange) -> UsageRow:
        """Record `ex`: hand its row to the observers and the store (never blocking), and
        learn the model's tokens per character from its prompt."""
        now = self._clock.seconds()
        tokens = ex.tokens
        row = UsageRow(
            at=now,
            route=ex.route,
            fp=ex.fp,
            model=ex.model,
            host=ex.host,
            path=ex.path,
            status=ex.status,
            stream=ex.stream,
            prompt_tokens=tokens.prompt,
            cached_tokens=tokens.cached,
            completion_tokens=tokens.completion,
            queue_ms=round(ex.queue_ms, 3),
            ttfb_ms=None
            if ex.first_byte is None
            else round((ex.first_byte - ex.started) * 1000, 3),
            duration_ms=round((now - ex.started) * 1000, 3),
            lease=ex.lease,
            error=ex.error,
        )
        for observer in self.observers:
            try:
                observer(row)
            except Exception:
                log.failure("usage observer failed")
        d = ensureDeferred(self._store.record_usage(row))
        d.addErrback(lambda f: log.failure("could not record usage", f))
        if tokens.prompt and ex.prompt_chars:
            self._guard.learn(ex.model, ex.prompt_chars, tokens.prompt)
        return row
