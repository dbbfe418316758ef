"""All the client sees of a host's answer: status, headers, the body as it arrives with
back-pressure, the idle timer, and the ending of a stream that was cut."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http import NO_BODY_CODES, PotentialDataLoss
from twisted.web.iweb import IResponse
from zope.interface import implementer

from crossbar.wire.answer import read_body
from crossbar.wire.continuation import NotContinued, Splice, Transcript
from crossbar.wire.dialects import Dialect
from crossbar.wire.errors import ClientError, write_error
from crossbar.wire.meter import Meter, Tokens
from crossbar.wire.upstream import hop_by_hop


@implementer(IPushProducer)
class _Body(Protocol):
    """Streams a response body to the client as it arrives, with back-pressure.

    It is the client request's streaming producer and passes pause/resume on to the upstream
    transport, so a client that stops reading pauses the upstream read; the idle timer stops
    meanwhile (the host is not silent, the client is slow). `done` fires when the body ended;
    `reason` says how. Cancelling `done` aborts the upstream response.
    """

    def __init__(
        self,
        request: Any,
        clock: IReactorTime,
        idle_timeout: float,
        write_timeout: float,
        on_data: Callable[[bytes], None],
    ) -> None:
        self._request = request
        self._clock = clock
        self._idle_timeout = idle_timeout
        self._write_timeout = write_timeout
        self._on_data = on_data
        self._timer: IDelayedCall | None = None
        self._last_data = 0.0  # when the host last sent (or the timer was armed)
        self._stalled: IDelayedCall | None = None  # the client is not reading
        self._registered = False
        self.write: Callable[[bytes], None] = request.write  # where the body goes
        self.stopped = ""  # why crossbar itself stopped the answer (an evacuation), if it did
        self.timed_out = False
        self.client_stalled = False
        self.reason: Failure | None = None
        self.done: Deferred[None] = Deferred(canceller=lambda _: self.stopProducing())

    def connectionMade(self) -> None:
        if self._request.channel is None:  # the client left before the body began
            self.transport.stopProducing()
            return
        self._request.registerProducer(self, True)
        self._registered = True
        self._arm()

    def pauseProducing(self) -> None:
        # The client's connection accepts no more for now: the host is not silent, so its idle
        # timer stops; the client has client_write_timeout to read on before it is dropped.
        self._disarm()
        if self._stalled is None:
            self._stalled = self._clock.callLater(self._write_timeout, self._drop_client)
        self.transport.pauseProducing()

    def resumeProducing(self) -> None:
        self._unstall()
        self._arm()
        self.transport.resumeProducing()

    def stopProducing(self) -> None:
        self._disarm()
        self._unstall()
        self.transport.stopProducing()

    def dataReceived(self, data: bytes) -> None:
        if self._request.channel is None:
            self.stopProducing()
            return
        # The idle timer is moved on lazily (`_idle`): a chunk costs a clock read, not a reset.
        self._last_data = self._clock.seconds()
        self._on_data(data)
        self.write(data)

    def connectionLost(self, reason: Failure = ResponseDone) -> None:  # type: ignore[assignment]
        self._disarm()
        self._unstall()
        if self._registered and self._request.channel is not None:
            self._request.unregisterProducer()
        self.reason = reason
        if not self.done.called:
            self.done.callback(None)

    def stop(self, why: str) -> None:
        """Stop the host's answer for crossbar's own reason (`why`): a cut to continue."""
        self.stopped = why
        self._disarm()
        self.transport.stopProducing()

    def complete(self) -> bool:
        """True when the body ended as the host meant it to."""
        reason = self.reason
        return (
            not self.timed_out
            and not self.stopped
            and reason is not None
            and reason.check(ResponseDone, PotentialDataLoss) is not None
        )

    def _arm(self) -> None:
        self._last_data = self._clock.seconds()
        if self._timer is None or not self._timer.active():
            self._timer = self._clock.callLater(self._idle_timeout, self._idle)

    def _disarm(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _idle(self) -> None:
        quiet = self._clock.seconds() - self._last_data
        if quiet < self._idle_timeout:  # data came since it was set: wait out the rest
            self._timer = self._clock.callLater(self._idle_timeout - quiet, self._idle)
            return
        self._timer = None
        self.timed_out = True
        self.transport.stopProducing()

    def _unstall(self) -> None:
        if self._stalled is not None and self._stalled.active():
            self._stalled.cancel()
        self._stalled = None

    def _drop_client(self) -> None:
        """The client took no byte for client_write_timeout: it goes, and so does the host's
        answer (its slot frees)."""
        self._stalled = None
        self.client_stalled = True
        if self._request.channel is not None:
            self._request.channel.transport.abortConnection()
        self.transport.stopProducing()


# A whole answer held until complete (so that a cut one shows nothing and may run again) is
# held up to this; a chat answer is a few KiB, and a larger one is relayed as it comes.
HOLD_MOST = 1024 * 1024


class Relay:
    """Writes one host's answer to the client. After `run` returns or raises, `status`,
    `stream`, `first_byte` (clock seconds), `tokens` and `error` say what happened.

    With a `transcript` (an answer crossbar may continue elsewhere), a stream that is cut is
    left open: `cut` says why, and the caller either continues it or calls `end_cut`. With
    `hold`, a whole answer is kept until it has all come, so a cut one has shown the client
    nothing (`cut` again, and `end_cut` answers 502)."""

    def __init__(
        self,
        request: Any,
        clock: IReactorTime,
        timeouts: tuple[float, float],
        dialect: Dialect,
        host: str,
        on_id: Callable[[str], None],
        on_whole: Callable[[Tokens], None] | None = None,
        transcript: Transcript | None = None,
        hold: bool = False,
    ) -> None:
        """`timeouts`: (upstream_idle_timeout, client_write_timeout); `on_whole` hears the
        tokens of an answer relayed whole just before the request finishes (the client's
        connection may deliver its next request as it does)."""
        self._request = request
        self._clock = clock
        self._idle_timeout, self._write_timeout = timeouts
        self._dialect = dialect
        self._host = host
        self._on_id = on_id
        self._on_whole = on_whole
        self._meter: Meter | None = None
        self._body: _Body | None = None
        self.transcript = transcript
        self._hold = hold
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._copied: list[bytes] = []  # the host's header names set on the client's answer
        self.status = 0
        self.stream = False
        self.first_byte: float | None = None
        self.error = ""
        self.cause = ""  # why the answer was cut (cut_cause), "" when it was not
        self.cut = ""  # the cause, while the cut answer is left for a continuation

    @property
    def tokens(self) -> Tokens:
        """Tokens of the answer as far as it went."""
        return self._meter.tokens if self._meter is not None else Tokens()

    def streamed(self) -> int:
        """Events of a stream relayed so far (about its output tokens); 0 for a whole answer
        and before the body began."""
        return self._meter.events if self._meter is not None else 0

    def movable(self) -> bool:
        """Whether a stop now could be continued elsewhere: a stream with a transcript that
        can be continued from here (not inside a tool call, its end not yet sent)."""
        t = self.transcript
        return self.stream and t is not None and self._body is not None and not t.why_not()

    def stop(self, why: str) -> bool:
        """Cut the host's answer for crossbar's own reason (an evacuation moving it); False
        when its body is not being read now."""
        body = self._body
        if body is None or body.done.called:
            return False
        body.stop(why)
        return True

    async def run(self, response: IResponse, extra: Iterable[tuple[bytes, bytes]]) -> None:
        """Relay status, headers (plus `extra`) and the body; make a cut stream detectable."""
        request = self._request
        self.status = response.code
        request.setResponseCode(response.code, response.phrase)
        drop = hop_by_hop(response.headers, response.connection_headers)
        mine = request.responseHeaders  # crossbar's own (CORS) are set already
        keep = getattr(mine, "keep", mine.setRawHeaders)  # values llhttp read need no cleaning
        for name, values in response.headers.getAllRawHeaders():
            low = name.lower()
            if low in drop or low.startswith(b"access-control-"):
                continue  # CORS is crossbar's alone (proxy/cors.py): the host's `*` never leaks
            if low == b"vary" and mine.hasHeader(b"vary"):
                values = [*mine.getRawHeaders(b"vary"), *values]
            keep(name, values)
            if self._hold:
                self._copied.append(name)
        for name, value in extra:
            request.responseHeaders.setRawHeaders(name, [value])
        ctype = (response.headers.getRawHeaders(b"content-type") or [b""])[0]
        self.stream = ctype.lower().startswith(b"text/event-stream")
        length = response.length
        if isinstance(length, int) and length > 0 and not self.stream:
            if request.method != b"HEAD" and response.code not in NO_BODY_CODES:
                # The host's length, kept: the body goes out as it came, not re-chunked (a
                # stream never has one: a cut stream ends with an error event of crossbar's).
                mine.setRawHeaders(b"content-length", [b"%d" % length])
        meter = self._meter = self._dialect.meter(self.stream, self._on_id)
        hold = self._keep if self._hold and not self.stream else None
        body = await self._read(response, hold)
        if body.complete():
            meter.finish()
            if self._on_whole is not None:
                self._on_whole(meter.tokens)
            if self._held:
                request.write(b"".join(self._held))
            request.finish()
            return
        if self._client_gone(body):
            return
        self.cause = cut_cause(body)
        if (self.stream and self.transcript is not None) or (self._hold and not self.stream):
            self.cut = self.cause  # the caller continues it, or ends it (end_cut)
            return
        self._end(self.error)

    def _keep(self, data: bytes) -> None:
        """Hold a whole answer's bytes; past HOLD_MOST it goes out as it comes after all (a
        cut of it can then no longer run again elsewhere)."""
        self._held.append(data)
        self._held_bytes += len(data)
        if self._held_bytes > HOLD_MOST:
            self._hold = False
            assert self._body is not None
            self._body.write = self._request.write
            self._request.write(b"".join(self._held))
            self._held.clear()

    async def _read(self, response: IResponse, write: Callable[[bytes], None] | None) -> _Body:
        """The host's body read to its end, written to the client (or to `write`); what it
        delivered counted when it was cut."""
        body = self._body = _Body(
            self._request, self._clock, self._idle_timeout, self._write_timeout, self._data
        )
        if write is not None:
            body.write = write
        response.deliverBody(body)
        try:
            await body.done
        finally:
            if not body.complete():
                assert self._meter is not None
                self._meter.delivered()
                self.error = _why_cut(body)
        return body

    def _client_gone(self, body: _Body) -> bool:
        """The client left, or stopped reading and was dropped: nothing more to write."""
        request = self._request
        if request.channel is None or body.client_stalled:
            if request.channel is not None:
                request.channel.transport.loseConnection()
            return True
        return False

    def end_cut(self, error: str = "") -> None:
        """End an answer left cut: a stream gets one error event in the dialect's shape and
        its connection closes without the terminating chunk; a whole answer held back is a
        502 in the dialect's shape."""
        self.cut = ""
        self._end(error or self.error)

    def _end(self, error: str) -> None:
        request = self._request
        if request.channel is None:
            return
        cut = ClientError(502, "api_error", f"host {self._host}: {error}")
        if self._hold and not self.stream:
            for name in self._copied:
                request.responseHeaders.removeHeader(name)
            write_error(request, cut, self._dialect)
            return
        if self.stream:
            # One error event, then close without the terminating chunk: the client can tell
            # the stream was cut. No [DONE] is ever invented.
            request.write(cut.stream_event(self._dialect.errors))
        request.channel.transport.loseConnection()

    def _data(self, data: bytes) -> None:
        if self.first_byte is None:
            self.first_byte = self._clock.seconds()
        assert self._meter is not None
        self._meter.feed(data)
        if self.transcript is not None and self.stream:
            self.transcript.feed(data)


class ContinuationRelay(Relay):
    """Relays a continuation into a stream its client already has (`Splice`): no status or
    headers of its own, the host's events rewritten. `run` raises NotContinued when the host
    did not continue the text (nothing of its answer written); a cut is left as `Relay`
    leaves one, for the next continuation."""

    def __init__(
        self,
        request: Any,
        clock: IReactorTime,
        timeouts: tuple[float, float],
        dialect: Dialect,
        host: str,
        on_id: Callable[[str], None],
        splice: Splice,
        transcript: Transcript,
        on_whole: Callable[[Tokens], None] | None = None,
    ) -> None:
        super().__init__(request, clock, timeouts, dialect, host, on_id, on_whole, transcript)
        self._splice = splice
        self._refused: NotContinued | None = None

    async def run(self, response: IResponse, extra: Iterable[tuple[bytes, bytes]] = ()) -> None:
        request = self._request
        self.status = response.code
        ctype = (response.headers.getRawHeaders(b"content-type") or [b""])[0]
        self.stream = ctype.lower().startswith(b"text/event-stream")
        meter = self._meter = self._dialect.meter(self.stream, self._on_id)
        if response.code != 200 or not self.stream:
            await read_body(response)
            raise NotContinued(f"the host answered {response.code}, not a stream")
        body = await self._read(response, self._spliced)
        if self._refused is not None:
            raise self._refused
        if body.complete():
            meter.finish()
            self._splice.finish()
            if self._on_whole is not None:
                self._on_whole(meter.tokens)
            request.finish()
            return
        if self._client_gone(body):
            return
        if not self._splice.confirmed:
            raise NotContinued(f"the host's answer was cut ({self.error}) before it continued")
        self.cut = self.cause = cut_cause(body)

    def _data(self, data: bytes) -> None:
        if self.first_byte is None:
            self.first_byte = self._clock.seconds()
        assert self._meter is not None
        self._meter.feed(data)  # the host's own events: its tokens

    def _spliced(self, data: bytes) -> None:
        if self._refused is not None:
            return
        try:
            self._splice.feed(data)
        except NotContinued as e:
            self._refused = e  # raised by run, once the host's answer is stopped
            assert self._body is not None
            self._body.stop("not_continued")


def cut_cause(body: _Body) -> str:
    """Why an answer was cut, as crossbar_resumes_total's `reason` says it: `evacuated` (or
    crossbar's other reason to stop it), `idle_timeout`, `reset` or `closed`."""
    if body.stopped:
        return body.stopped
    if body.timed_out:
        return "idle_timeout"
    reason = body.reason
    if reason is not None and reason.check(ResponseFailed) is not None:
        inner = getattr(reason.value, "reasons", [])
        if any(
            f.check(ConnectionLost) is not None and f.check(ConnectionDone) is None for f in inner
        ):
            return "reset"
    return "closed"


def _why_cut(body: _Body) -> str:
    """Why a body ended before the host meant it to ("" when our own caller stopped it)."""
    if body.client_stalled:
        return "client stopped reading"
    if body.stopped:
        return f"stopped ({body.stopped})"
    if body.timed_out:
        return "upstream idle timeout"
    if body.reason is None:
        return ""
    return "upstream closed mid-response"


KEEP = 64 * 1024  # bytes of an answer a KeepingRelay keeps


class KeepingRelay(Relay):
    """A Relay that also keeps the first KEEP bytes of the answer in `kept` (a route that
    records message contents on its spans); the plain Relay pays nothing for it."""

    kept = b""

    def _data(self, data: bytes) -> None:
        super()._data(data)
        room = KEEP - len(self.kept)
        if room > 0:
            self.kept += data[:room]
