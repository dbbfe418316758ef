"""Running batches (docs/reference.md, "Batches": running): each instance claims items from
the store, runs each through the proxy's whole request path at class `batch` (proxy/inside.py),
and writes its result under its claim; a timer renews the claims, ends what a batch's end leaves
unrun, and finalizes batches whose items have all ended.

An item runs where the proxy puts a batch request (its key's lease, else the host with batch
room, the one its system prompt went to first), under the batch cap, yielding to people's
turns, charged to the batch's key like any request. What an answer means for the item:

- 200: its output line;
- a host's failure (5xx, 408, a cut answer, crossbar's own 502, 503 and 504): tried again after
  a growing pause, `batch_retries` times, then its error line with the last answer;
- 429 for a rate (the key's rpm, tpm or max_in_flight, a full queue): tried again when the
  answer's Retry-After says, not counted; for a spent budget (tokens_per_day, _month): its
  error line at once;
- any other 4xx: its error line at once.
"""

from __future__ import annotations

import json
import re
import secrets
from collections import Counter
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from crossbar.batches.objects import answered_line, failed_line, new_id, not_run_line
from crossbar.config import Config
from crossbar.hosts import Hosts
from crossbar.proxy import InsideAnswer, InsideRequest
from crossbar.store import BatchTally, Claim, Ended, FileRow, Store, StoreError

log = Logger(namespace="crossbar.batches")

_BUDGET = re.compile(r"\((tokens_per_day|tokens_per_month)\)")
_PAUSE_MAX = 60.0  # the longest pause before an item is tried again
TICK = 1.0  # the runner's timer: claims renewed, ends closed, batches finalized, items claimed
PRUNE_EVERY = 3600.0  # ended batches past batch_retention are pruned this often
TALLY_EVERY = 5.0  # the batches and items /metrics shows are read this often (they count rows)

Inside = Callable[[InsideRequest], Deferred[InsideAnswer]]


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")


def _tokens(body: Any) -> tuple[int, int, int]:
    """(prompt, cached, completion) tokens an answer's usage says."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0, 0

    def number(value: Any) -> int:
        return value if isinstance(value, int) and 0 <= value < 2**31 else 0

    prompt = number(usage.get("prompt_tokens", usage.get("input_tokens")))
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    cached = number(details.get("cached_tokens")) if isinstance(details, dict) else 0
    completion = number(usage.get("completion_tokens", usage.get("output_tokens")))
    return prompt, min(cached, prompt), completion


def _message(body: Any) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message", ""))
    return str(error or "")


def _retry_after(answer: InsideAnswer) -> float | None:
    values = answer.headers.getRawHeaders(b"retry-after")
    try:
        return float(values[-1]) if values else None
    except ValueError:
        return None


class Retry:
    """An item to run again from `when`; `counted`: it used one of its attempts."""

    def __init__(self, when: float, counted: bool, why: str) -> None:
        self.when = when
        self.counted = counted
        self.why = why


def judge(claim: Claim, answer: InsideAnswer, retries: int, now: float) -> Ended | Retry:
    """What `answer` means for the item `claim` (the module's rules)."""
    status = answer.status
    body = _json(answer.body)
    request_id = body.get("id") if isinstance(body, dict) and body.get("id") else new_id("req_")

    def ended(state: str, line: str) -> Ended:
        prompt, cached, completion = _tokens(body) if state == "done" else (0, 0, 0)
        return Ended(claim.batch, claim.line, state, line, prompt, cached, completion)

    if answer.cut:
        if claim.attempts >= retries:
            why = "the host's answer was cut short on every attempt"
            return ended("failed", failed_line(claim.custom_id, "host_failed", why))
        return Retry(now + _pause(claim.attempts), True, "answer cut")
    if status == 200:
        return ended("done", answered_line(claim.custom_id, status, str(request_id), body))
    if status == 429:
        if _BUDGET.search(_message(body)):
            return ended("failed", answered_line(claim.custom_id, status, str(request_id), body))
        wait = _retry_after(answer)
        return Retry(now + (wait if wait is not None else 5.0), False, "429")
    if status == 408 or status >= 500:
        if claim.attempts >= retries:
            return ended("failed", answered_line(claim.custom_id, status, str(request_id), body))
        return Retry(now + _pause(claim.attempts), True, str(status))
    return ended("failed", answered_line(claim.custom_id, status, str(request_id), body))


def _pause(attempts: int) -> float:
    return min(_PAUSE_MAX, 2.0 ** (attempts + 1))


class BatchRunner:
    """This instance's share of every batch's items (the module's rules)."""

    def __init__(self, config: Config, clock: IReactorTime, store: Store, hosts: Hosts) -> None:
        self._config = config
        self._clock = clock
        self._store = store
        self._hosts = hosts
        self.inside: Inside | None = None  # the proxy's way in (wiring sets it)
        # Batch requests the hosts could start now under their batch caps (wiring sets it from
        # the limiter's batch room).
        self.spare: Callable[[], int] = self._every_slot
        # This process's claims: a restart of the same instance must not find its old ones
        # still its own, so the token is new for each run.
        self.token = f"{store.instance}.{secrets.token_hex(4)}"
        self._running: dict[tuple[str, int], InsideRequest] = {}
        self._ends: list[Ended] = []
        self._writing: Deferred[None] | None = None
        self._retrying: set[Deferred[None]] = set()
        self._claiming = False
        self._halted = False
        self._renewed = clock.seconds()
        self._pruned = float("-inf")
        self._tallied = float("-inf")
        self.outcomes: Counter[str] = Counter()  # done, failed, retried, lost
        self.degraded = ""  # the store's last failure, while it lasts
        self.tally: BatchTally | None = None  # the store's batches, as of the last tick

    def reconfigure(self, config: Config) -> None:
        self._config = config

    @property
    def in_flight(self) -> int:
        """Items this instance runs now."""
        return len(self._running)

    def want(self) -> int:
        """Items to claim now. With `batch_in_flight` set: up to that many running. Else as
        many as the hosts' batch caps let start now (`spare`: what people leave free; an item
        sent where none is free would only queue there, while another host's slot frees), and
        one at least while none runs, so a batch beside hosts people keep busy still waits
        its turn (and ages) in a queue."""
        chosen = self._config.server.batch_in_flight
        if chosen:
            return chosen - len(self._running)
        spare = self.spare()
        return max(spare, 0 if self._running else 1)

    def _every_slot(self) -> int:
        """Without the limiter's word (`spare`): every slot of the healthy, non-draining hosts
        and one more a host, less what runs."""
        hosts = self._hosts
        return sum(
            1 + sum(hosts.parallel(name, m.name) for m in hosts.models(name))
            for name in hosts.names()
            if hosts.healthy(name) and not hosts.draining(name)
        ) - len(self._running)

    async def tick(self) -> None:
        """The timer's work: renew claims, end what ending batches leave, finalize, claim."""
        if self._halted:
            return
        now = self._clock.seconds()
        timeout = self._config.server.batch_claim_timeout
        try:
            if self._running and now - self._renewed >= timeout / 3:
                await self._store.renew_claims(self.token, now + timeout)
                self._renewed = now
            if now - self._pruned >= PRUNE_EVERY:
                self._pruned = now
                pruned = await self._store.prune_batches(now - self._config.server.batch_retention)
                if pruned:
                    log.info("batches: {n} ended batches pruned, with their files", n=pruned)
            if not self._running and not await self._store.any_batch_running():
                self.degraded = ""
                self._flush()
                await self._tally(now)
                return  # nothing to do: one read a tick, no write
            await self._store.close_ending(now, not_run_line)
            for batch_id in await self._store.start_finalizing(now, now + timeout):
                await self._finish(batch_id)
            self.degraded = ""
        except StoreError as e:
            self._store_failed(e)
        self._flush()
        await self.fill()
        await self._tally(now)

    async def _tally(self, now: float) -> None:
        if now - self._tallied >= TALLY_EVERY or self.tally is None:
            self._tallied = now
            await self.refresh_snapshot()

    async def refresh_snapshot(self) -> None:
        """Read every batch by status and the unended ones' items by state (all instances'),
        which /metrics shows at scrape; when the store cannot answer, the last read stays."""
        try:
            self.tally = await self._store.batch_tally()
        except StoreError as e:
            self._store_failed(e)

    def _store_failed(self, error: StoreError) -> None:
        if not self.degraded:
            log.warn("batches: the store failed, items wait: {error}", error=str(error))
        self.degraded = str(error)

    async def _finish(self, batch_id: str) -> None:
        now = self._clock.seconds()
        row = await self._store.read_batch(batch_id)
        if row is None:
            return
        output = FileRow(new_id("file-"), row.route, row.key, "batch_output",
                         f"{batch_id}_output.jsonl", 0, 0, now)  # fmt: skip
        error = FileRow(new_id("file-"), row.route, row.key, "batch_output",
                        f"{batch_id}_error.jsonl", 0, 0, now)  # fmt: skip
        status = await self._store.finish_batch(batch_id, now, output, error)
        if status is not None:
            log.info("batch {id} {status}", id=batch_id, status=status)
            self._tallied = float("-inf")  # a batch ended: /metrics hears it at this tick

    async def fill(self) -> None:
        """Claim items while this instance has room for them."""
        if self._claiming or self._halted or self.inside is None:
            return
        self._claiming = True
        try:
            while not self._halted:
                want = self.want()
                if want <= 0:
                    return
                now = self._clock.seconds()
                timeout = self._config.server.batch_claim_timeout
                try:
                    claims = await self._store.claim_items(self.token, now, now + timeout, want)
                except StoreError as e:
                    self._store_failed(e)
                    return
                if not self._running:
                    self._renewed = now  # what was claimed now runs until now + timeout
                for claim in claims:
                    self._start(claim)
                if len(claims) < want or not self._config.server.batch_in_flight:
                    # By the hosts' batch room, one claim a time: the items just started are
                    # not in the limiter yet, so the room read again now would count them free.
                    return
        finally:
            self._claiming = False

    def _start(self, claim: Claim) -> None:
        assert self.inside is not None
        path = f"/r/{claim.route}{claim.endpoint}".encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"x-crossbar-class", b"batch"),
        ]
        request = InsideRequest(b"POST", path, headers, claim.body.encode(), claim.key or None)
        self._running[(claim.batch, claim.line)] = request
        d = self.inside(request)
        d.addCallbacks(self._answered, self._aborted, (claim,), None, (claim,))

    def _answered(self, answer: InsideAnswer, claim: Claim) -> None:
        self._running.pop((claim.batch, claim.line), None)
        now = self._clock.seconds()
        verdict = judge(claim, answer, self._config.server.batch_retries, now)
        if isinstance(verdict, Retry):
            self.outcomes["retried"] += 1
            d = Deferred.fromCoroutine(self._retry(claim, verdict))
            self._retrying.add(d)
            d.addErrback(lambda f: log.failure("batch item retry", f))
            d.addBoth(lambda _: self._retrying.discard(d))
        else:
            self.outcomes[verdict.state] += 1
            self._ends.append(verdict)
            self._flush()
        self.refill()

    def _aborted(self, failure: Any, claim: Claim) -> None:
        self._running.pop((claim.batch, claim.line), None)
        if not failure.check(CancelledError):
            log.failure("batch item {batch}:{line}", failure, batch=claim.batch, line=claim.line)

    async def _retry(self, claim: Claim, retry: Retry) -> None:
        try:
            await self._store.retry_item(
                self.token, claim.batch, claim.line, retry.when, retry.counted
            )
        except StoreError as e:
            self._store_failed(e)  # the claim runs out and the item is claimed again

    def refill(self) -> None:
        """Claim what there is room for, now (a batch was created, an item ended)."""
        d = Deferred.fromCoroutine(self.fill())
        d.addErrback(lambda f: log.failure("batch claims", f))

    def _flush(self) -> None:
        """Write the ended items' results: one write at a time, the ends that came meanwhile
        together in the next."""
        if self._writing is not None or not self._ends:
            return
        ends, self._ends = self._ends, []
        self._writing = Deferred.fromCoroutine(self._write(ends))

    async def _write(self, ends: list[Ended]) -> None:
        try:
            written = await self._store.end_items(self.token, ends)
        except StoreError as e:
            self._store_failed(e)
            self._ends[:0] = ends  # kept, and written when the store answers again (tick)
            return
        finally:
            self._writing = None
        lost = written.count(False)
        if lost:
            # Their claims ran out (this instance was cut off from the store for longer than
            # batch_claim_timeout) and another instance runs them: its result is the one kept.
            self.outcomes["lost"] += lost
            log.warn("batches: {n} results not kept: their claims went to another instance",
                     n=lost)  # fmt: skip
        self._flush()

    async def settled(self) -> None:
        """Wait until the results and retries written so far are in the store."""
        while self._writing is not None or self._retrying:
            if self._writing is not None:
                await self._writing
            for d in list(self._retrying):
                await d

    def halt(self) -> None:
        """Claim no more (a stop begins); what runs may finish."""
        self._halted = True

    async def stop(self) -> None:
        """After the proxy's drain: write what ended, give back the claims still held (another
        instance runs them at once)."""
        self._halted = True
        for request in list(self._running.values()):
            request.abort()
        await self.settled()
        if self._ends:
            self._flush()
            await self.settled()
        try:
            await self._store.release_claims(self.token)
        except StoreError as e:
            log.warn("batches: claims not given back, they run out instead: {error}",
                     error=str(e))  # fmt: skip
