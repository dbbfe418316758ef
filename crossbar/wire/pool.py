"""Kept HTTP/1.1 connections to the hosts, in place of twisted.web's Agent and its pool; the
answers they carry are read by answer.py.

A connection carries one request at a time. Every request is one write of its head (and
body). The answer's head, body and end, as one read brings them, are passed on once that read
is parsed whole: only then does a connection whose answer ended go back to its host's idle
list (at most `per_host` that have rested, and those still resting; the rest close) and its
caller hear that the host is free (`on_done`), before the answer's last bytes are relayed. A
connection is never kept when its host sent bytes after the answer, answered before the
request had all been sent (its body would wait in front of the next request), or said
`Connection: close`.

A kept connection rests before it carries another request, so that whatever the host sends
unasked (a stale second answer) shows while no request is outstanding, and retires it instead
of being read as the next request's answer: `QUIET` after an answer of known length, and
`PROBATION` after a chunked answer until the host is known to keep such connections. A host
that closes its connection after every streamed (chunked) answer, as llama-server does while
it says `Keep-Alive`, is learned the first time one closes in its probation: from then on a
connection is not kept after a chunked answer of that host, and a spare is opened as such an
answer begins, so the request that takes its slot next finds one ready. A host that closes
idle connections after some seconds is learned too, from its `Keep-Alive: timeout=` (which
llama-server's cpp-httplib sends: 5 s) or from a close seen, and a connection idle for most of
that time is closed rather than raced. One idle for `keep_idle`
seconds closes.

A kept connection with bytes (or its end) waiting in its socket, unread yet, when it is taken
is retired, not used. Bytes a host sends with no request outstanding, or after an answer in the
same read, are an unsolicited answer: counted against the host, logged (once a minute at most),
and the host is distrusted for `DISTRUST` seconds after its latest one: its connections are not
kept (each request to it opens one, asks `Connection: close` and closes it after the answer), so
no later stale answer of it can be read as another request's. What HTTP/1.1 cannot tell apart
(docs/reference.md, "The request path"): a stale answer that arrives after the next request was
written on its connection is that request's answer as far as the bytes say; the rest, the peek
and the distrust narrow that window, and close it after the first one seen.

At most `max_connections` connections to one host are open or opening at once (idle, busy and
connecting all count: a thousand slotless requests to a one-slot host must not take a thousand
descriptors). A request that would open one more waits, first come first served, for one to
come free: a kept connection once it has rested, or room left by one that closed (a fresh
request, the retry, takes only room, and an idle connection closes to make it). One that waits
`connect_wait` fails with `ConnectionsBusy`; one whose caller cancels leaves the queue.
"""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

import httptools
from attrs import frozen
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import URI, ResponseDone, ResponseFailed
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import IAgentEndpointFactory

from crossbar.wire.answer import HostClosed, HostResponse, NotHTTP, Reading
from crossbar.wire.twisted_private import unsent, write_now

_MAX_ORIGINS = 4096  # parsed host URLs kept (one per configured host in practice)
# A kept connection rests this long after its answer before it carries another request.
QUIET = 0.05
# ... and this long after a chunked answer, until its host is known to keep such connections:
# a host that closes one within it closes after every chunked answer.
PROBATION = 1.0
# A busy host's resting connections are kept beyond `per_host`, up to this many times it.
_RESTING_SHARE = 4
# A connection is reused while it has been idle for less than this share of the idle time
# after which its host was seen to close one.
_IDLE_MARGIN = 0.75
# A host that sent an unsolicited answer has no connection kept this long after its latest one.
DISTRUST = 600.0
# More unsolicited answers of a distrusted host are logged together, once in this long at most.
_LOG_EVERY = 60.0
# A peek that neither blocks nor takes the bytes (MSG_DONTWAIT where the system has it).
_PEEK = socket.MSG_PEEK | getattr(socket, "MSG_DONTWAIT", 0)
# The soonest requests waiting for a connection are woken again for one still resting.
_WAKE_MIN = 0.001
log = Logger(namespace="crossbar.upstream")


class HostConnection(Protocol):
    """One connection to a host: one request at a time, its answer parsed as it comes."""

    def __init__(self) -> None:
        self.pool: HostPool | None = None
        self.origin: _Origin | None = None
        self.lost = False
        self.idle_since = 0.0
        self.kept = False  # it has been kept for another request at least once
        self.after_chunked = False  # its last answer was chunked
        self.expiry: IDelayedCall | None = None
        self.counted = False  # one of its host's `open` connections (made by `HostPool._open`)
        self.socket: socket.socket | None = None  # a plain TCP connection's, for `waiting`
        self._answer: Deferred[HostResponse] | None = None
        self.reading: Reading | None = None  # the answer it reads now
        self._received = False  # a byte of the answer came
        self._early = False  # the answer began before the request had all been sent
        self._ended: tuple[Reading, bool] | None = None  # an answer that ended in this read
        self._paused = False

    def connectionMade(self) -> None:
        handle = getattr(self.transport, "getHandle", None)
        handle = handle() if handle is not None else None
        # TLS's handle is its OpenSSL connection, whose bytes are records, not answers.
        self.socket = handle if isinstance(handle, socket.socket) else None

    def waiting(self) -> bytes | None:
        """What waits in the socket, unread by the reactor yet: a byte, b"" for the host's
        close, or None for nothing (or no socket to look in: TLS, a test's transport)."""
        if self.socket is None:
            return None
        try:
            return self.socket.recv(1, _PEEK)
        except BlockingIOError:
            return None
        except OSError:
            return b""  # reset: as good as closed

    # -- one request

    def request(
        self,
        data: bytes,
        body: bytes | None,
        head_only: bool,
        on_done: Callable[[], None] | None = None,
    ) -> Deferred[HostResponse]:
        """Write a request (its head `data`, then `body`); fires with the answer once its
        head is in, or fails (HostClosed, NotHTTP). `on_done` is called once the answer has
        all been read and the connection is free, before the end of it is relayed."""
        self._answer = Deferred(self._cancel)
        self.reading = Reading(self, head_only, on_done)
        self._received = self._early = False
        write_now(self.transport, (data, body) if body else (data,))
        return self._answer

    def _cancel(self, answer: Deferred[HostResponse]) -> None:
        self._answer = None  # the Deferred fails with CancelledError; the connection goes
        self.abort()

    def dataReceived(self, data: bytes) -> None:
        if self.lost:
            return  # crossbar gave up on it (the client left): whatever comes is dropped
        reading = self.reading
        if reading is None or reading.done:
            # Bytes nobody asked for (a stale second answer): the connection cannot be
            # trusted with another request, nor its host for a while.
            self.unsolicited()
            self.abort()
            return
        self._received = True
        failure: Exception | None = None
        try:
            reading.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            failure = NotHTTP("the host switched protocols")
        except httptools.HttpParserError as e:
            failure = reading.failure or NotHTTP(reading.unreadable(e))
        ended, self._ended = self._ended, None
        if ended is not None:
            # The answer is whole; bytes after it (the failure) cost its connection, and they
            # are an answer nobody asked for.
            if failure is not None:
                self.unsolicited()
            self._free(ended[0], keep=ended[1] and failure is None)
            failure = None
        reading.pass_on()
        if failure is not None:
            self.fail(reading, failure)

    def answered(self, reading: Reading, response: HostResponse) -> None:
        """The answer's head is in."""
        answer, self._answer = self._answer, None
        self._early = unsent(self.transport)
        origin = self.origin
        if reading.chunked and origin is not None and origin.closes_after_chunked:
            assert self.pool is not None
            self.pool.spare(origin)  # this one closes when the answer ends: one ready for next
        if reading.head_only:
            # A HEAD's answer has no body whatever its length says: it ends here, and the
            # connection goes (llhttp cannot be told to skip the body).
            reading.done = True
            self.reading = None
            if answer is not None:
                answer.callback(response)
            response.end(Failure(ResponseDone()))
            self.abort()
        elif answer is not None:
            reading.held.append(partial(answer.callback, response))

    def ended(self, reading: Reading, keep: bool) -> None:
        """The answer has all been read (llhttp says so from inside its parse): the connection
        is freed once the whole read is parsed (`_free`), the answer's end passed on after."""
        reading.done = True
        self.reading = None
        self._ended = (reading, keep)
        response = reading.response
        if response is not None:
            response.read_whole = True
            reading.held.append(partial(response.end, Failure(ResponseDone())))

    def _free(self, reading: Reading, keep: bool) -> None:
        """The read that ended `reading`'s answer is parsed: the connection is kept for the
        next request (first, so a request waiting on this answer's end can take it at once)
        when it may be, and the caller hears the host is free."""
        origin = self.origin
        self.after_chunked = reading.chunked
        if reading.chunked and origin is not None and origin.closes_after_chunked:
            keep = False  # the host closes it now: a request on it would be lost
        if self._early or unsent(self.transport):
            keep = False  # the rest of the request would reach the host before the next
        if keep and origin is not None and not origin.idle_close and reading.response is not None:
            origin.idle_close = _keep_alive_timeout(reading.response.connection_headers)
        if keep and self.pool is not None:
            self.pool.release(self)
        else:
            self.abort()
        if reading.on_done is not None:
            reading.on_done()

    # -- the connection

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        by_host = not self.lost  # not aborted by crossbar first
        self.lost = True
        pool = self.pool
        if pool is not None:
            counted = self.counted
            pool.forget(self)
            unanswered = self.reading is None or (self._answer is not None and not self._received)
            if by_host and unanswered:
                pool.closed_unasked(self)
            if counted and self.origin is not None and self.origin.waiters:
                pool.serve(self.origin)  # its room goes to the first request waiting
        answer, self._answer = self._answer, None
        if answer is not None:
            answer.errback(HostClosed(self._received, reason))
            return
        reading, self.reading = self.reading, None
        if reading is None or reading.done or reading.response is None:
            return
        reading.done = True
        if not reading.sized():  # a body that runs to the close: it ended as the host meant
            reading.response.end(Failure(PotentialDataLoss()))
        else:
            reading.response.end(Failure(ResponseFailed([reason])))

    def fail(self, reading: Reading, error: Exception) -> None:
        """The answer `reading` reads failed with `error`: whoever waits hears it, and the
        connection goes."""
        if reading is not self.reading:  # garbage after an answer that ended: it goes
            self.abort()
            return
        reading.done = True
        self.reading = None
        answer, self._answer = self._answer, None
        self.abort()
        if answer is not None:
            answer.errback(error)
        elif reading.response is not None:
            reading.response.end(Failure(ResponseFailed([Failure(error)])))

    def unsolicited(self) -> None:
        """The host sent bytes no request of this connection asked for."""
        if self.pool is not None:
            self.pool.unsolicited(self)

    def pause(self) -> None:
        if not self._paused and not self.lost:
            self._paused = True
            self.transport.pauseProducing()  # type: ignore[union-attr]

    def resume(self) -> None:
        if self._paused and not self.lost:
            self._paused = False
            self.transport.resumeProducing()  # type: ignore[union-attr]

    def stop(self) -> None:
        """The body's reader gives up: the answer is dropped with its connection."""
        if self.reading is not None:
            self.abort()

    def abort(self) -> None:
        if not self.lost and self.transport is not None:
            self.lost = True  # never handed out again, whatever comes before the close
            pool, counted = self.pool, self.counted
            if pool is not None:
                pool.forget(self)
            self.transport.abortConnection()  # type: ignore[attr-defined]
            if pool is not None and counted and self.origin is not None and self.origin.waiters:
                pool.serve(self.origin)  # its room goes to the first request waiting


class _Factory(Factory):
    noisy = False  # no "Starting factory" line per connection
    protocol = HostConnection


class _Origin:
    """A host URL's scheme, host and port, parsed once: its endpoint and Host header."""

    __slots__ = (
        "closes_after_chunked",
        "distrust_timer",
        "distrust_until",
        "distrusted",
        "host",
        "idle",
        "idle_close",
        "keeps_after_chunked",
        "key",
        "logged_at",
        "open",
        "serving",
        "sparing",
        "unlogged",
        "unsolicited",
        "uri",
        "waiters",
        "wake",
    )

    def __init__(self, origin: bytes) -> None:
        self.uri = URI.fromBytes(origin + b"/")
        self.key = origin
        self.host = origin.split(b"//", 1)[-1]  # the authority as configured: host[:port]
        self.idle: list[HostConnection] = []
        self.closes_after_chunked = False  # learned: see the module doc
        self.keeps_after_chunked = False  # learned: one outlived its probation
        self.idle_close = 0.0  # learned: the host closed a connection idle this long
        self.sparing = False  # a spare connection is being opened
        self.unsolicited = 0  # answers it sent that nobody asked for
        self.distrusted = False  # one came in the last DISTRUST seconds: nothing kept
        self.distrust_until = 0.0
        self.distrust_timer: IDelayedCall | None = None
        self.logged_at = 0.0  # when its unsolicited answers were last logged
        self.unlogged = 0  # ... and how many came since
        self.open = 0  # connections open or opening: idle, busy, connecting
        self.waiters: deque[_Waiter] = deque()  # requests waiting for one (at the bound)
        self.wake: IDelayedCall | None = None  # when a resting one will have rested, for them
        self.serving = False  # `HostPool.serve` runs for it: no second one inside it


class ConnectionsBusy(Exception):
    """No connection to the host came free within the wait: `limit` are open already."""

    def __init__(self, limit: int, waited: float) -> None:
        super().__init__(f"{limit} connections to the host open, none free within {waited:g} s")
        self.limit = limit
        self.waited = waited


class _Waiter:
    """A request waiting for a connection to its host: `done` fires with it (or fails)."""

    __slots__ = ("done", "fresh", "on_open", "opening", "timer")

    def __init__(self, fresh: bool, on_open: Callable[[], None] | None) -> None:
        self.fresh = fresh  # takes only room for a new connection, never a kept one
        self.on_open = on_open
        self.done: Deferred[HostConnection] = Deferred()
        self.timer: IDelayedCall | None = None
        self.opening: Deferred[HostConnection] | None = None  # its new connection, once it may

    def give(self, connection: HostConnection) -> None:
        if self.done.called:  # its caller left as it connected
            connection.abort()
        else:
            self.done.callback(connection)

    def fail(self, failure: Failure) -> None:
        if not self.done.called:
            self.done.errback(failure)


@frozen
class PoolCounts:
    """What the pool knows of one host's connections, for the metrics."""

    unsolicited: int = 0  # answers the host sent that nobody asked for
    distrusted: bool = False  # its connections are not kept now (see the module doc)
    open: int = 0  # connections open or opening
    waiting: int = 0  # requests waiting for one to come free


class HostPool:
    """Kept connections per host URL; `request` sends one request on one of them."""

    def __init__(
        self,
        clock: Any,
        endpoints: IAgentEndpointFactory,
        per_host: int = 64,
        keep_idle: float = 240.0,
        max_connections: int = 256,
        connect_wait: float = 10.0,
    ) -> None:
        self._clock = clock
        self.endpoints = endpoints
        self.per_host = per_host
        self.keep_idle = keep_idle
        self.max_connections = max_connections
        self.connect_wait = connect_wait
        self._factory = _Factory()
        self._origins: dict[bytes, _Origin] = {}
        self.connects = 0  # connections opened

    def origin(self, url: bytes) -> tuple[_Origin, bytes]:
        """The origin of `url` and its request target (path and query)."""
        start = url.find(b"//") + 2
        cut = url.find(b"/", start)
        base, target = (url, b"/") if cut < 0 else (url[:cut], url[cut:])
        origin = self._origins.get(base)
        if origin is None:
            if len(self._origins) >= _MAX_ORIGINS:
                self._origins.clear()
            origin = self._origins[base] = _Origin(base)
        return origin, target

    def counts(self, url: str) -> PoolCounts:
        """What the pool knows of the connections to the host at `url` (nothing yet: zeros)."""
        origin = self._origins.get(self.origin_key(url.encode()))
        if origin is None:
            return PoolCounts()
        return PoolCounts(origin.unsolicited, origin.distrusted, origin.open, len(origin.waiters))

    @staticmethod
    def origin_key(url: bytes) -> bytes:
        """`url`'s scheme, host and port: what its connections are kept by."""
        start = url.find(b"//") + 2
        cut = url.find(b"/", start)
        return url if cut < 0 else url[:cut]

    def take(self, origin: _Origin) -> HostConnection | None:
        """A kept connection to `origin` that has rested (see the module doc), the one used
        last (warmest) among them, or None (and None while requests wait for one: they come
        first). One idle for most of the time after which its host closes idle connections is
        closed instead of raced."""
        if origin.waiters:
            return None
        return self._take(origin)

    def _take(self, origin: _Origin) -> HostConnection | None:
        idle = origin.idle
        now = self._clock.seconds()
        stale = origin.idle_close * _IDLE_MARGIN if origin.idle_close else None
        for i in range(len(idle) - 1, -1, -1):
            connection = idle[i]
            rested = now - connection.idle_since
            if connection.lost:
                continue
            if stale is not None and rested >= stale:
                connection.abort()  # leaves `idle`: the loop runs from the end
                continue
            if connection.after_chunked and not origin.keeps_after_chunked:
                if rested < PROBATION:
                    continue
                origin.keeps_after_chunked = True  # it outlived its probation
            elif rested < QUIET:
                continue
            del idle[i]
            waiting = connection.waiting()
            if waiting is not None:
                # Come since the reactor last read: a stale answer (or the host's close) that
                # the next request would read as its own.
                if waiting:
                    connection.unsolicited()  # distrusts its host: the others close too
                else:
                    self.closed_unasked(connection)
                connection.abort()
                if origin.distrusted:
                    return None
                continue
            return connection
        return None

    def connect(
        self,
        origin: _Origin,
        fresh: bool = False,
        on_open: Callable[[], None] | None = None,
    ) -> Deferred[HostConnection]:
        """A new connection to `origin`; at `max_connections`, the first to come free (kept
        and rested, unless `fresh`; else a new one in the room one leaves), waited for at most
        `connect_wait` (then `ConnectionsBusy`). `on_open` is called as a new connection
        begins to be made (its connect timeout runs from then)."""
        if origin.open < self.max_connections and not origin.waiters:
            if on_open is not None:
                on_open()
            return self._open(origin)
        waiter = _Waiter(fresh, on_open)
        waiter.done = Deferred(lambda _: self._leave(origin, waiter))
        waiter.timer = self._clock.callLater(self.connect_wait, self._give_up, origin, waiter)
        origin.waiters.append(waiter)
        self.serve(origin)  # a fresh one may close an idle connection for its room
        return waiter.done

    def _open(self, origin: _Origin) -> Deferred[HostConnection]:
        self.connects += 1
        origin.open += 1
        endpoint = self.endpoints.endpointForURI(origin.uri)

        def made(connection: HostConnection) -> HostConnection:
            connection.pool, connection.origin = self, origin
            connection.counted = True
            return connection

        def failed(failure: Failure) -> Failure:
            origin.open -= 1
            self.serve(origin)
            return failure

        return endpoint.connect(self._factory).addCallbacks(made, failed)

    def serve(self, origin: _Origin) -> None:
        """Hand what came free to `origin`'s waiters, first come first served: a kept
        connection that has rested (never to a fresh waiter), else room for a new one (an idle
        connection closes to make it for a fresh waiter, when idle ones fill it). When the
        first waiter can have nothing yet, it is served again once a resting connection will
        have rested (or when one closes or is released)."""
        waiters = origin.waiters
        if origin.serving or not waiters:
            return
        origin.serving = True
        try:
            while waiters:
                waiter = waiters[0]
                connection = None if waiter.fresh else self._take(origin)
                if connection is None and origin.open >= self.max_connections:
                    idle = [c for c in origin.idle if not c.lost]
                    if not (waiter.fresh and idle):
                        break
                    idle[0].abort()  # the coldest; it leaves `idle`, and its room
                    continue
                waiters.popleft()
                if waiter.timer is not None and waiter.timer.active():
                    waiter.timer.cancel()
                if connection is not None:
                    waiter.give(connection)
                else:
                    if waiter.on_open is not None:
                        waiter.on_open()
                    waiter.opening = self._open(origin)
                    waiter.opening.addCallbacks(waiter.give, waiter.fail)
        finally:
            origin.serving = False
        if waiters:
            self._wake_when_rested(origin)

    def _wake_when_rested(self, origin: _Origin) -> None:
        """Serve `origin`'s waiters again when its first resting connection will have rested."""
        probation = not origin.keeps_after_chunked
        rested = [
            c.idle_since + (PROBATION if c.after_chunked and probation else QUIET)
            for c in origin.idle
            if not c.lost
        ]
        if not rested:
            return  # they wait for a release or a close
        # At least a millisecond: `take` judges the rest by a subtraction, which may find a
        # hair short of it what this sum finds due (a timer at once would fire forever).
        delay = max(_WAKE_MIN, min(rested) - self._clock.seconds())
        wake = origin.wake
        if wake is not None and wake.active():
            if wake.getTime() <= self._clock.seconds() + delay:
                return
            wake.cancel()
        origin.wake = self._clock.callLater(delay, self._woken, origin)

    def _woken(self, origin: _Origin) -> None:
        origin.wake = None
        self.serve(origin)

    def _leave(self, origin: _Origin, waiter: _Waiter) -> None:
        """The waiter's caller cancelled: it leaves the queue, or stops its connect."""
        if waiter.timer is not None and waiter.timer.active():
            waiter.timer.cancel()
        if waiter in origin.waiters:
            origin.waiters.remove(waiter)
        elif waiter.opening is not None:
            waiter.opening.cancel()

    def _give_up(self, origin: _Origin, waiter: _Waiter) -> None:
        if waiter in origin.waiters:
            origin.waiters.remove(waiter)
        waiter.fail(Failure(ConnectionsBusy(self.max_connections, self.connect_wait)))

    def reconfigure(self, max_connections: int, connect_wait: float) -> None:
        """A new bound and wait: a larger bound serves the waiters it has room for at once;
        a smaller one closes nothing (connections close as they are done with)."""
        self.connect_wait = connect_wait
        if max_connections != self.max_connections:
            self.max_connections = max_connections
            for origin in list(self._origins.values()):
                self.serve(origin)

    def spare(self, origin: _Origin) -> None:
        """Open a connection to `origin` ahead of need, unless one is idle or on its way."""
        now = self._clock.seconds()
        if origin.sparing or origin.distrusted:
            return  # (a distrusted host's connections are not kept: a spare would be closed)
        if origin.open >= self.max_connections or origin.waiters:
            return  # at the bound: the request that needs one waits its turn
        if any(not c.lost and now - c.idle_since >= QUIET for c in origin.idle):
            return
        origin.sparing = True

        def ready(connection: HostConnection) -> None:
            origin.sparing = False
            self.release(connection)

        def failed(_: Failure) -> None:
            origin.sparing = False  # the request that needs it will connect and say why

        self._open(origin).addCallbacks(ready, failed)

    def closed_unasked(self, connection: HostConnection) -> None:
        """The host closed `connection` with nothing asked of it or answered on it since its
        last answer: soon after a chunked answer, it closes after every one; later, it closes
        connections idle that long (the latest such time is kept)."""
        origin = connection.origin
        if origin is None or not connection.kept:
            return  # it never answered anything: nothing to learn
        idle = self._clock.seconds() - connection.idle_since
        if connection.after_chunked and idle <= PROBATION:
            if not origin.closes_after_chunked and not origin.keeps_after_chunked:
                origin.closes_after_chunked = True
                log.info(
                    "host {host} closes its connection after each streamed answer: a new one "
                    "is opened ahead of the next request instead",
                    host=origin.host.decode("ascii", "replace"),
                )
        elif idle > PROBATION and connection.reading is None:
            # Learned only while it sat in the pool: a close after a request was written may
            # be the request's doing (a crash), and its time counts the host's work.
            origin.idle_close = idle

    def release(self, connection: HostConnection) -> None:
        """An answer was all read: keep its connection for the next request, or close it.

        `per_host` bounds the rested connections kept: those resting (`QUIET`) cannot carry a
        request yet, so a busy host (more requests in a `QUIET` than `per_host`) keeps them
        too, up to `_RESTING_SHARE` times more, rather than close each and connect anew for
        the next request. While requests wait for a connection (at `max_connections`), it is
        kept whatever `per_host` says: it goes to the first of them once it has rested."""
        origin = connection.origin
        if origin is None:
            connection.abort()
            return
        if origin.distrusted:
            connection.abort()  # its host sent an answer nobody asked for: see the module doc
            return
        idle, now = origin.idle, self._clock.seconds()
        cap = self.per_host
        # `idle` is in the order of release (a connection leaves it from anywhere, but joins
        # only at its end): the rested ones come first.
        if (
            len(idle) >= cap
            and not origin.waiters
            and (len(idle) >= cap * _RESTING_SHARE or now - idle[cap - 1].idle_since >= QUIET)
        ):
            connection.abort()
            return
        connection.idle_since = now
        connection.kept = True
        origin.idle.append(connection)
        if connection.expiry is None:
            connection.expiry = self._clock.callLater(self.keep_idle, self._expire, connection)
        if origin.waiters:
            self.serve(origin)  # it rests first: they are woken when it has

    def _expire(self, connection: HostConnection) -> None:
        # One timer per connection, moved on lazily: a request made on it costs no timer.
        connection.expiry = None
        if connection.lost:
            return
        origin = connection.origin
        idle = origin is not None and connection in origin.idle
        left = connection.idle_since + self.keep_idle - self._clock.seconds()
        if idle and left <= 0:
            connection.abort()
            return
        wait = left if idle else self.keep_idle
        connection.expiry = self._clock.callLater(wait, self._expire, connection)

    def forget(self, connection: HostConnection) -> None:
        """`connection` is closed, or closing: out of the pool, its room free."""
        origin = connection.origin
        if origin is not None and connection.counted:
            connection.counted = False
            origin.open -= 1
        if origin is not None and connection in origin.idle:
            origin.idle.remove(connection)
        if connection.expiry is not None and connection.expiry.active():
            connection.expiry.cancel()
        connection.expiry = None

    def unsolicited(self, connection: HostConnection) -> None:
        """`connection`'s host sent an answer nobody asked for: counted, logged (the first at
        once, the next ones once a `_LOG_EVERY` at most), and the host distrusted until
        `DISTRUST` seconds after its latest one (its kept connections close now)."""
        origin = connection.origin
        if origin is None:
            return
        now = self._clock.seconds()
        origin.unsolicited += 1
        origin.distrust_until = now + DISTRUST
        host = origin.host.decode("ascii", "replace")
        if not origin.distrusted:
            origin.distrusted = True
            origin.logged_at, origin.unlogged = now, 0
            log.warn(
                "host {host} sent an answer nobody asked for on a kept connection: its "
                "connections are not kept (a new one per request, closed after its answer) "
                "until it sends none for {minutes:g} minutes",
                host=host,
                minutes=DISTRUST / 60,
            )
            for kept in list(origin.idle):
                kept.abort()  # they may hold stale answers of their own, not arrived yet
            origin.distrust_timer = self._clock.callLater(DISTRUST, self._trust_again, origin)
        elif now - origin.logged_at >= _LOG_EVERY:
            log.warn(
                "host {host} sent {count} more answers nobody asked for ({total} in all)",
                host=host,
                count=origin.unlogged + 1,
                total=origin.unsolicited,
            )
            origin.logged_at, origin.unlogged = now, 0
        else:
            origin.unlogged += 1

    def _trust_again(self, origin: _Origin) -> None:
        # One timer per distrusted host, moved on lazily: each unsolicited answer moves only
        # `distrust_until`.
        left = origin.distrust_until - self._clock.seconds()
        if left > 0:
            origin.distrust_timer = self._clock.callLater(left, self._trust_again, origin)
            return
        origin.distrust_timer = None
        origin.distrusted = False
        log.info(
            "host {host} sent no answer nobody asked for in {minutes:g} minutes ({unlogged} "
            "more since the last line, {total} in all): its connections are kept again",
            host=origin.host.decode("ascii", "replace"),
            minutes=DISTRUST / 60,
            unlogged=origin.unlogged,
            total=origin.unsolicited,
        )
        origin.unlogged = 0

    def close(self) -> None:
        """Close every kept connection."""
        for origin in self._origins.values():
            for timer in (origin.distrust_timer, origin.wake):
                if timer is not None and timer.active():
                    timer.cancel()
            origin.distrust_timer = origin.wake = None
            idle, origin.idle = origin.idle, []
            for connection in idle:
                connection.abort()


def _keep_alive_timeout(headers: Any) -> float:
    """The idle time after which a host says it closes a kept connection (`Keep-Alive:
    timeout=5`, as llama-server's cpp-httplib sends), or 0.0 when it does not say."""
    for value in headers.getRawHeaders(b"keep-alive") or ():
        for part in value.split(b","):
            name, _, seconds = part.partition(b"=")
            if name.strip().lower() == b"timeout":
                try:
                    return max(0.0, float(seconds.strip()))
                except ValueError:
                    return 0.0
    return 0.0


def request_head(
    method: bytes,
    target: bytes,
    host: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes | None,
    close: bool = False,
) -> bytes:
    """The bytes of a request's head (`close`: asking the host to close the connection after
    its answer)."""
    lines = [method, b" ", target, b" HTTP/1.1\r\nHost: ", host, b"\r\n"]
    for name, value in headers:
        lines += (name, b": ", value, b"\r\n")
    if close:
        lines.append(b"Connection: close\r\n")
    if body is not None:
        lines.append(b"Content-Length: %d\r\n" % len(body))
    lines.append(b"\r\n")
    return b"".join(lines)
