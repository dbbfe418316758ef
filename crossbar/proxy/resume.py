"""Answers that survive their host (docs/reference.md, "Answers that survive their host").

An inference answer whose host fails is not lost:
- a streamed answer cut after its first byte (the connection closed or reset, the read timeout,
  an evacuation stopping it) continues on another host of the route from the text the client
  has (wire/continuation.py), in the same client stream;
- an answer that showed the client nothing (a whole answer held until complete, or any answer
  whose host failed before its first byte) runs again on another host, unless it carries an
  `Idempotency-Key` whose first answer crossbar has already recorded.

The route's `resume_attempts` bounds both (0: neither). What cannot be continued (a tool call,
structured output, several choices, a host that will not continue a trailing assistant
message) ends as it always did, with the reason counted. This module decides; the request's
sequence (resource.py) places and sends the continuation like any turn.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import orjson
from attrs import define, evolve, frozen
from twisted.internet.defer import CancelledError
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from crossbar.proxy.call import Call
from crossbar.proxy.placement import Placement
from crossbar.tenants import ClientKey, Reservation
from crossbar.wire import (
    IDEMPOTENCY_HEADERS,
    Before,
    ClientError,
    Exchange,
    Family,
    Kind,
    NotContinued,
    Relay,
    Splice,
    Tokens,
    Transcript,
    continuation_body,
    continuation_family,
    continuation_refusal,
)

log = Logger(namespace="crossbar.resume")

# Why crossbar did not try (crossbar_resumes_total{outcome="refused"}), beside the answer's own
# (wire/continuation.py: tool_call, reasoning, finished, n, structured, prompt, dialect).
DISABLED = "disabled"  # the route's resume_attempts is 0
ATTEMPTS = "attempts"  # the route's resume_attempts are spent
NO_PREFILL = "no_prefill"  # no host left that continues a trailing assistant message
ANSWERED = "idempotency_key"  # an Idempotency-Key whose first answer crossbar recorded
NO_HOST = "no_other_host"  # an answer that showed nothing runs again only on another host
# Outcomes.
RESUMED = "resumed"  # the answer went on and ended whole
FAILED = "failed"  # a continuation or a re-run was tried and did not end whole
REFUSED = "refused"  # not tried
# A host found not to continue a trailing assistant message is not asked again for this long
# (a restart with other flags is then noticed).
NO_PREFILL_FOR = 3600.0
_ANSWERED_KEPT = 8192  # Idempotency-Keys remembered as answered, the latest
_ANSWERED_FOR = 24 * 3600.0


@frozen
class Resume:
    """One time an answer moved, or was not moved, as the usage row and the counter tell it:
    why it was cut (`closed`, `reset`, `idle_timeout`, `not_http`, `evacuated`, `drained`),
    why it was not continued ("" when it was tried), the outcome once known ("" while the
    re-run of an answer that showed nothing runs), the hosts, and the tokens the client had
    and the new host prefilled again."""

    cause: str
    refused: str
    outcome: str
    source: str
    target: str = ""
    sent: int = 0
    prefilled: int = 0


@define
class Continuation:
    """A stream continuing on another host: the client's view of it, and the rewriter of the
    new host's events."""

    transcript: Transcript
    before: Before
    splice: Splice
    first: Tokens  # the tokens the answer had before this continuation


def idempotency_key(headers: Any) -> str | None:
    """The request's `Idempotency-Key` (or `X-Idempotency-Key`), or None."""
    for name in IDEMPOTENCY_HEADERS:
        values = headers.getRawHeaders(name)
        if values:
            return values[-1].decode("latin-1")
    return None


def combined(first: Tokens, pieces: int, second: Tokens) -> Tokens:
    """An answer's tokens across a continuation: the prompt as the request had it (the new
    host read the text already given as prompt: that is the client's output, not its input),
    the output of both hosts."""
    prompt = max(0, second.prompt - pieces) if second.prompt else first.prompt
    return Tokens(
        prompt=prompt,
        cached=min(second.cached, prompt) if second.prompt else first.cached,
        completion=pieces + second.completion,
        prompt_ms=second.prompt_ms,
        predicted_ms=first.predicted_ms + second.predicted_ms,
    )


class Forward(Protocol):
    """The request path from the lease step to the relay (resource.py `_forward`): the relay
    that ran, None for a host's busy answer read."""

    def __call__(
        self,
        request: Any,
        call: Call,
        ex: Exchange,
        key: ClientKey | None,
        charged: list[Reservation] | None,
        continuation: Continuation | None = None,
    ) -> Awaitable[Relay | None]: ...


class Resumer:
    """Answers that survive their host: `answer` forwards an inference call and continues its
    cut stream elsewhere, `again` re-runs an answer that showed nothing; and what it learns:
    hosts that do not continue, Idempotency-Keys answered, the streams running per host (an
    evacuation stops them to continue elsewhere)."""

    def __init__(self, clock: IReactorTime, placement: Placement) -> None:
        self._clock = clock
        self._placement = placement
        self._no_prefill: dict[str, float] = {}  # host -> when it was found not to continue
        self._answered: OrderedDict[tuple[str, str, str], float] = OrderedDict()
        self._streams: dict[str, set[Relay]] = {}

    # -- what can be continued, and where

    def request_refusal(self, call: Call) -> str:
        """Why `call`'s streamed answer could never be continued ("" when it could)."""
        if call.route.resume_attempts == 0:
            return DISABLED
        return continuation_refusal(call.dialect, call.inbound.path, call.inbound.body)

    def may_continue(self, call: Call) -> bool:
        """Whether a cut of `call`'s streamed answer might be continued: its relay reads it."""
        return call.kind is Kind.INFERENCE and not self.request_refusal(call)

    def holds(self, call: Call) -> bool:
        """Whether `call`'s whole answer is held until it has all come (a cut one can then run
        again, having shown the client nothing): a text generation on a route that resumes."""
        return (
            call.kind is Kind.INFERENCE
            and call.route.resume_attempts > 0
            and continuation_family(call.dialect, call.inbound.path) is not None
        )

    def continues(self, host: str) -> bool:
        """Whether `host` may be asked to continue a trailing assistant message (not found
        otherwise within NO_PREFILL_FOR)."""
        found = self._no_prefill.get(host)
        return found is None or self._clock.seconds() - found > NO_PREFILL_FOR

    def will_not_continue(self, host: str) -> None:
        """`host` answered a continuation as a new turn (`--no-prefill-assistant`)."""
        if host not in self._no_prefill:
            log.warn(
                "host {host} does not continue a trailing assistant message "
                "(--no-prefill-assistant?): cut answers are not continued there",
                host=host,
            )
        self._no_prefill[host] = self._clock.seconds()

    def targets(self, call: Call, cut: str, prefill: bool) -> tuple[str, ...]:
        """The candidates a moved answer may go to: the route's others (those that continue a
        trailing assistant message, when `prefill`); the cut host alone when the route has no
        other ("once it answers again")."""
        others = tuple(h for h in call.candidates if h != cut)
        if not others:
            others = (cut,)
        return tuple(h for h in others if not prefill or self.continues(h))

    def continuation(
        self, call: Call, relay: Relay, ex: Exchange, write: Callable[[bytes], None]
    ) -> tuple[Call, Continuation] | str:
        """The call that continues `relay`'s cut stream and how to splice it, or why not."""
        transcript = relay.transcript
        assert transcript is not None
        why = transcript.why_not() or self._spent(call, ex)
        if why:
            return why
        # A raw completion goes on from its prompt: any host continues that.
        prefill = transcript.kind in (Family.CHAT, Family.ANTHROPIC)
        targets = self.targets(call, ex.host, prefill)
        if not targets:
            return NO_PREFILL
        before = Before(transcript.text, transcript.pieces, len(ex.resumes) + 1)
        body = continuation_body(
            transcript.kind, call.inbound.body, transcript.text, transcript.pieces
        )
        inbound = evolve(call.inbound, body=body, raw=orjson.dumps(body))
        splice = Splice(transcript, before, write)
        first = ex.tokens
        return evolve(call, inbound=inbound, candidates=targets), Continuation(
            transcript, before, splice, first
        )

    def rerun(self, call: Call, ex: Exchange, host: str, headers: Any) -> Call | str:
        """The call that runs an answer that showed the client nothing again, elsewhere, or
        why not."""
        why = self._spent(call, ex)
        if why:
            return why
        key = idempotency_key(headers)
        if key is not None and self._was_answered(call, ex, key):
            return ANSWERED
        others = tuple(h for h in call.candidates if h != host)
        return evolve(call, candidates=others) if others else NO_HOST

    def _spent(self, call: Call, ex: Exchange) -> str:
        attempts = call.route.resume_attempts
        if attempts == 0:
            return DISABLED
        tried = sum(1 for r in ex.resumes if not r.refused)
        return ATTEMPTS if tried >= attempts else ""

    # -- Idempotency-Keys whose first answer was recorded

    def answered(self, call: Call, ex: Exchange, headers: Any) -> None:
        """`call` was answered whole: its Idempotency-Key, if any, is recorded as answered."""
        key = idempotency_key(headers)
        if key is None:
            return
        entry = (call.route.name, ex.key, key)
        self._answered[entry] = self._clock.seconds()
        self._answered.move_to_end(entry)
        while len(self._answered) > _ANSWERED_KEPT:
            self._answered.popitem(last=False)

    def _was_answered(self, call: Call, ex: Exchange, key: str) -> bool:
        when = self._answered.get((call.route.name, ex.key, key))
        return when is not None and self._clock.seconds() - when < _ANSWERED_FOR

    # -- streams running, which an evacuation may move

    @contextmanager
    def running(self, host: str, relay: Relay) -> Iterator[None]:
        """`relay` streams an answer of `host` that may be continued elsewhere."""
        streams = self._streams.setdefault(host, set())
        streams.add(relay)
        try:
            yield
        finally:
            streams.discard(relay)
            if not streams:
                self._streams.pop(host, None)

    def streaming(self, host: str) -> int:
        """Answers of `host` streaming now that could be moved (what `stop` would cut)."""
        return sum(1 for relay in self._streams.get(host, ()) if relay.movable())

    def stop(self, host: str, why: str) -> int:
        """Cut every stream of `host` that can be continued now (`why`: evacuated, drained),
        each to go on where its conversation's lease now is; how many were cut. One that
        cannot (inside a tool call, its answer's end already sent) runs to its end there."""
        movable = [r for r in self._streams.get(host, ()) if r.movable()]
        return sum(1 for relay in movable if relay.stop(why))

    # -- the moves

    async def answer(
        self,
        forward: Forward,
        request: Any,
        call: Call,
        ex: Exchange,
        key: ClientKey | None,
        charged: list[Reservation],
    ) -> None:
        """Forward an inference call; while its streamed answer is cut, continue it on another
        host, or end it as a cut stream ends."""
        relay = await forward(request, call, ex, key, charged)
        while relay is not None and relay.cut:
            transcript = relay.transcript
            cause, source = relay.cut, ex.host
            sent = transcript.pieces if transcript is not None else 0
            step = self.continuation(call, relay, ex, request.write)
            if isinstance(step, str):
                self._record(ex, Resume(cause, step, REFUSED, source, sent=sent))
                relay.end_cut()
                return
            following, continuation = step
            await self._placement.leave(following, source)
            if ex.trace is not None:
                ex.trace.resumed(source, cause, sent)
            error = relay.error
            try:
                moved = await forward(request, following, ex, key, charged, continuation)
            except CancelledError:
                raise
            except Exception as e:
                if isinstance(e, NotContinued) and ex.host != source:
                    self.will_not_continue(ex.host)
                why = e.message if isinstance(e, ClientError) else str(e)
                self._record(ex, Resume(cause, "", FAILED, source, ex.host, sent))
                ex.error = f"{error}; not continued: {why}"
                relay.end_cut(error)
                return
            went_on = moved is not None and (bool(moved.cut) or not moved.error)
            prefilled = max(0, ex.tokens.prompt + continuation.before.pieces - ex.tokens.cached)
            outcome = RESUMED if went_on else FAILED
            self._record(ex, Resume(cause, "", outcome, source, ex.host, sent, prefilled))
            relay = moved

    async def again(
        self, request: Any, call: Call, ex: Exchange, host: str, cause: str
    ) -> Call | None:
        """An answer that showed the client nothing failed on `host` (`cause`): the call that
        runs it again elsewhere (its conversation's lease moved first), or None (counted)."""
        again = self.rerun(call, ex, host, request.requestHeaders)
        if isinstance(again, str):
            self._record(ex, Resume(cause, again, REFUSED, host))
            return None
        await self._placement.leave(again, host)
        self._record(ex, Resume(cause, "", "", host))
        if ex.trace is not None:
            ex.trace.resumed(host, cause, 0)
        ex.error = ""
        return again

    # -- what is told

    def _record(self, ex: Exchange, r: Resume) -> None:
        ex.resumes.append(r)
        self.told(ex, r)

    def told(self, ex: Exchange, r: Resume) -> None:
        """Log one resume as it is decided or ends."""
        if r.refused:
            log.info(
                "answer of {route} on {host} cut ({cause}) after {sent} tokens: not continued "
                "({why})",
                route=ex.route,
                host=r.source,
                cause=r.cause,
                sent=r.sent,
                why=r.refused,
            )
            return
        log.info(
            "answer of {route} moved from {source} to {target} ({cause}) after {sent} tokens: "
            "{outcome}, {prefilled} tokens prefilled again",
            route=ex.route,
            source=r.source,
            target=r.target or "?",
            cause=r.cause,
            sent=r.sent,
            outcome=r.outcome or "re-run",
            prefilled=r.prefilled,
        )
