"""One finished exchange becomes its usage row, its id memory and the guard's learning, each
done once."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from typing import Protocol

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from crossbar.leases import Journal
from crossbar.proxy.guard import ContextGuard
from crossbar.proxy.ids import IdMemory
from crossbar.records import UsageRow
from crossbar.wire import Exchange

log = Logger(namespace="crossbar.usage")
_request_log = Logger(namespace="crossbar.request")  # the request log line's namespace
Observer = Callable[[UsageRow], None]
UNKNOWN_ROUTE = "(unknown)"  # the route of a request refused before its route was known
MAX_UNSAVED_ROWS = 100_000  # kept through a store outage; past it the oldest go (counted)
REPORT_LOG_INTERVAL = 60.0  # seconds between log lines of one host's refused counts


class RefusalLog:
    """Which refusals before routing get a log line of their own: per client address, the
    first `burst` in each `interval`; the rest are counted and told in one line per address
    when the interval ends ("N more like this from PEER"). A client pipelining requests for a
    route that does not exist once wrote a line per request, 16 MB in seconds."""

    def __init__(self, clock: IReactorTime, burst: int = 10, interval: float = 60.0) -> None:
        self._clock = clock
        self.burst = burst
        self.interval = interval
        self._ends = 0.0  # when the interval now running ends
        self._logged: dict[str, int] = {}  # per address, lines this interval
        self._unlogged: dict[str, int] = {}  # per address, refusals not logged this interval
        self._timer: IDelayedCall | None = None  # the end of an interval with refusals unlogged

    def admit(self, peer: str) -> bool:
        """A refusal for a client at `peer`: True when it gets its own line."""
        now = self._clock.seconds()
        if now >= self._ends:
            self._tell()
            self._logged.clear()
            self._ends = now + self.interval
        logged = self._logged.get(peer, 0)
        if logged < self.burst:
            self._logged[peer] = logged + 1
            return True
        self._unlogged[peer] = self._unlogged.get(peer, 0) + 1
        if self._timer is None:
            self._timer = self._clock.callLater(self._ends - now, self._tell)
        return False

    def _tell(self) -> None:
        """One line per address whose refusals were not all logged in the interval ended."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        unlogged, self._unlogged = self._unlogged, {}
        for peer, count in unlogged.items():
            line = (
                f"{count} more requests like these from {peer or '-'} refused before routing "
                f"in {self.interval:.0f}s (not logged one by one)"
            )
            _request_log.info("{line}", line=line, peer=peer, refused=count)


class UsageStore(Protocol):
    """What the recorder needs of the store."""

    async def record_usage_rows(self, rows: list[UsageRow]) -> None: ...


class UsageRecorder:
    """Turns finished exchanges into usage rows for the observers (the request log line,
    metrics) and the store, remembers completion ids with their host, and teaches the guard.

    Rows are written in group commits: one write is in flight at a time, and the rows that
    finish meanwhile go together in the next. An idle crossbar writes each row at once; a busy
    one pays one commit (one fsync on PostgreSQL) per batch instead of per request. `flush`
    waits until every finished row is written (a usage answer, a stop).

    While the store is degraded (the journal says so) rows wait in memory, at most
    MAX_UNSAVED_ROWS, and are written when it recovers; rows the store refuses wait too."""

    def __init__(
        self,
        store: UsageStore,
        ids: IdMemory,
        guard: ContextGuard,
        clock: IReactorTime,
        journal: Journal | None = None,
        observers: list[Observer] | None = None,
    ) -> None:
        self._store = store
        self._landed: Deferred[None] | None = None  # the write in flight
        self._ids = ids
        self._guard = guard
        self._clock = clock
        self._journal = journal
        self.observers: list[Observer] = list(observers or [])
        # The request log line: told every row, but refusals before routing only as
        # `refusals` lets through (the other observers count every one).
        self.log_line: Observer | None = None
        self.refusals = RefusalLog(clock)
        self.unsaved: deque[UsageRow] = deque(maxlen=MAX_UNSAVED_ROWS)
        self.dropped = 0  # rows that did not fit while the store was down
        # Answers whose host reported counts out of bounds, per (host, reason): never stored.
        self.refused_reports: Counter[tuple[str, str]] = Counter()
        # Answers that moved, or could not (proxy/resume.py): (route, reason, outcome).
        self.resumes: Counter[tuple[str, str, str]] = Counter()
        self._refusals_told: dict[tuple[str, str], float] = {}
        self._pending: list[UsageRow] = []  # waiting for the write in flight to finish
        self._writing = False
        if journal is not None:
            journal.listeners.append(self._store_state)

    def remember_id(self, id_: str, host: str, fp: str) -> None:
        """A completion or response id showed in an answer: side calls that name it go to
        `host` (called once per answer, as soon as the id shows)."""
        self._ids.remember([id_], host, fp, self._clock.seconds())

    def finish(self, ex: Exchange) -> UsageRow:
        """Record `ex`: hand its row to the observers and the store (never blocking), and
        learn the model's tokens per character from its prompt."""
        row = self._row(ex)
        if ex.tokens.refused:
            self._refused_counts(ex.host, ex.tokens.refused)
        for r in ex.resumes:  # an open re-run's outcome is the request's own
            outcome = r.outcome or ("resumed" if 0 < ex.status < 500 and not ex.error else "failed")
            self.resumes[(ex.route, r.refused or r.cause, outcome)] += 1
        self._tell(row)
        self._write(row)
        if ex.tokens.prompt and ex.prompt_chars:
            self._guard.learn(ex.model, ex.prompt_chars, ex.tokens.prompt)
        return row

    def _refused_counts(self, host: str, why: str) -> None:
        """A host reported counts crossbar cannot take (wire/reported.py): counted per host
        and reason, and said in the log once a minute per host and reason at most (a broken
        host says it on every answer)."""
        self.refused_reports[(host, why)] += 1
        now = self._clock.seconds()
        if now - self._refusals_told.get((host, why), -REPORT_LOG_INTERVAL) < REPORT_LOG_INTERVAL:
            return
        self._refusals_told[(host, why)] = now
        log.warn(
            "host {host} reported token counts or times out of bounds ({why}): that answer's "
            "counts are not stored, charged or learned ({n} so far)",
            host=host,
            why=why,
            n=self.refused_reports[(host, why)],
        )

    def refused(self, ex: Exchange, peer: str = "") -> UsageRow:
        """A request refused before a route was known (unknown route, no route, a body or a
        request line too large): counted under the route "(unknown)" unless `ex` names one,
        logged as `refusals` allows for its client at `peer`, never stored, so a scanner
        cannot fill the usage table or the log."""
        row = self._row(ex)
        self._tell(row, self.refusals.admit(peer))
        return row

    def refused_early(self, route: str, path: str, status: int, why: str, peer: str = "") -> None:
        """A request the site refused before the proxy saw it (a body over `max_body`, a
        request line or head too long, a slow or unparsable request)."""
        now = self._clock.seconds()
        ex = Exchange(now, route or UNKNOWN_ROUTE, path, status=status, error=why)
        self.refused(ex, peer)

    def _tell(self, row: UsageRow, logged: bool = True) -> None:
        if logged and self.log_line is not None:
            try:
                self.log_line(row)
            except Exception:
                log.failure("the request log line failed")
        for observer in self.observers:
            try:
                observer(row)
            except Exception:
                log.failure("usage observer failed")

    def _row(self, ex: Exchange) -> UsageRow:
        now = self._clock.seconds()
        tokens = ex.tokens
        return UsageRow(
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
            key=ex.key,
            fallback_from=ex.fallback_from,
            fallback_reason=ex.fallback_reason,
            request_class=ex.request_class,
            resumed=sum(1 for r in ex.resumes if not r.refused),
        )

    def _write(self, row: UsageRow) -> None:
        if self._journal is not None and self._journal.degraded:
            self._hold(row)
            return
        self._pending.append(row)
        if not self._writing:
            self._start()

    def _start(self) -> None:
        rows, self._pending = self._pending, []
        self._writing = True
        d = self._landed = ensureDeferred(self._store.record_usage_rows(rows))
        d.addCallbacks(self._written, self._refused, errbackArgs=(rows,))

    async def flush(self) -> None:
        """Wait until the rows of every finished request are written (those waiting for the
        write in flight too): the admin's usage answers count them all, a stop loses none.
        While the store is degraded it returns at once: those rows wait for its recovery."""
        while self._writing or self._pending:
            if not self._writing:
                self._start()
            landed = self._landed
            if landed is None:
                break
            waiting: Deferred[None] = Deferred()
            landed.addBoth(_passing_to, waiting)
            await waiting
            if self._journal is not None and self._journal.degraded:
                break  # held for the store's recovery, which a stop does not wait for

    def _written(self, _: object) -> None:
        self._writing = False
        self._landed = None
        if self._pending:
            self._start()

    def _refused(self, failure: Failure, rows: list[UsageRow]) -> None:
        self._writing = False
        self._landed = None
        waiting, self._pending = rows + self._pending, []
        if self._journal is None:
            log.failure("could not record {n} usage rows", failure, n=len(rows))
            return
        self._journal.report(failure.value)  # the store fails: degraded, and tried again
        for row in waiting:
            self._hold(row)

    def _hold(self, row: UsageRow) -> None:
        if len(self.unsaved) == self.unsaved.maxlen:
            self.dropped += 1
        self.unsaved.append(row)

    def _store_state(self, degraded: bool) -> None:
        if degraded or not self.unsaved:
            return
        rows, self.unsaved = list(self.unsaved), deque(maxlen=MAX_UNSAVED_ROWS)
        log.info("writing {n} usage rows kept during the store outage", n=len(rows))
        for row in rows:
            self._write(row)


def _passing_to(result: object, waiting: Deferred[None]) -> object:
    """Fire `waiting` and pass `result` on: a second listener on a Deferred in flight."""
    waiting.callback(None)
    return result
