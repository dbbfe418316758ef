"""Where each request goes, and what its answer teaches: the lease step of the request path.

Which requests make which lease (docs/architecture.md, "Which requests make a lease"):
- a call that names a running completion goes where that runs, and makes nothing;
- a call with no conversation of its own (no fingerprint on an `affinity = "conversation"`
  route: a control call such as `GET /props`, and equally an inference request whose body
  names no conversation, such as `{"messages": []}` or `{"messages": 5}`) makes no lease: it
  goes where the route lease is, if the route has one, else where a new lease would go, and
  takes only its own slot;
- every other call takes its lease by the table's rules (leases/table.py): the conversation's own,
  or on an `affinity = "route"` route the route's one lease, which every call of the route,
  control calls first among them, shares;
- a lease whose first request is refused (by crossbar's context guard after the lease was
  made, or by the host with a 4xx other than 408 and 429) is forgotten again (event reason
  `refused`): a request nobody could serve places nothing;
- an answered turn tells the cache truth (leases/warmth.py): a conversation whose host evicted its
  prefix is placed again at its next turn (event reason `cold`), as a new one would be;
- a conversation whose router-mode host unloaded its model since its last turn has lost its
  cache there: its next turn follows the model to a host that has it loaded, if one does
  (event reason `unloaded`), else stays and has it loaded back (loaded.py);
- a batch request (proxy/classes.py) makes no lease and moves none: it runs where its key's
  lease already is, when its host is healthy and not draining, else where the batch cap lets it
  start soonest, the host its shared system prompt last went to first (leases/table.py
  `Table.spare`); what it caches there teaches nothing of any conversation;
- a named key's conversation with no lease of its own, whose fingerprint before the key scoped
  it (fingerprint.scoped) has a lease made before this instance started (by a version that did
  not scope it), gets a new lease on that lease's host if it can take new ones: the first turn
  after the upgrade stays warm, and the old lease expires unused.
"""

from __future__ import annotations

from collections import OrderedDict

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from crossbar.hosts import Hosts
from crossbar.leases import Acquired, Key, Lease, Table, Warmth
from crossbar.proxy.call import Call
from crossbar.proxy.fingerprint import system_digest
from crossbar.proxy.loaded import LoadedModels
from crossbar.wire import Kind, Tokens

log = Logger(namespace="crossbar.placement")

_BATCH_HOMES = 4096  # shared system prompts whose batch home is remembered


def refusal(status: int) -> bool:
    """A host's answer that says the request itself was wrong: 4xx, but not 408 (the host
    timed the request out) nor 429 (the host is busy), which say nothing of the request."""
    return 400 <= status < 500 and status not in (408, 429)


class Placement:
    """The lease step: `place` before a call is sent, `refused` / `answered` after."""

    def __init__(
        self,
        table: Table,
        hosts: Hosts,
        warmth: Warmth,
        clock: IReactorTime,
        models: LoadedModels | None = None,
    ) -> None:
        """`models`: which models router-mode hosts have loaded (None: every model always is)."""
        self._table = table
        self._hosts = hosts
        self._warmth = warmth
        self._clock = clock
        self._models = models
        self._started = clock.seconds()  # leases made before this were made without scoping
        # (route, model, shared system prompt's digest) -> the host its batch requests last
        # went to: a batch sharing a system prompt keeps it cached on one host. In memory, as
        # the least recently placed fall out: a batch request placed elsewhere costs one
        # prefill of its system prompt, never a conversation's.
        self._batch_homes: OrderedDict[tuple[str, str, str], str] = OrderedDict()

    @property
    def warmth(self) -> Warmth:
        """The cache truth the placement reads (and teaches)."""
        return self._warmth

    def expected_cached(self, call: Call, acquired: Acquired) -> int:
        """Prompt tokens a call's host is expected to have cached: what the previous turn of
        a reused lease left there (0 for a new lease, or one whose host evicted it)."""
        if not acquired.reused or not call.conversation:
            return 0
        host = self._warmth.host(acquired.host)
        return 0 if host is None else host.tokens_of(call.key)

    async def place(self, call: Call) -> Acquired:
        """The host for `call`; raises the table's LeaseError (NoHost, PinnedDown)."""
        acquired = await self._place(call)
        if self._models is not None and call.kind is Kind.INFERENCE:
            self._models.expect(acquired.host, call.model)
        return acquired

    async def _place(self, call: Call) -> Acquired:
        table, key = self._table, call.key
        if call.origin is not None and self._hosts.healthy(call.origin):
            pinned = table.pinned(key.route) is not None
            return Acquired(call.origin, reused=True, pinned=pinned)
        if call.batch:
            return self._place_batch(call)
        peers = call.route.peers
        if not call.conversation:
            # Nothing to keep anywhere: where the route lease is, else where a new lease would
            # go, recording nothing (one GET /props or one junk body must not make the lease
            # every conversation of the route then inherits).
            return table.peek(key, call.candidates, peers)
        now = self._clock.seconds()
        if call.kind is Kind.INFERENCE:
            lease = table.lease(key)
            models = self._models
            if lease is not None and models is not None:
                if models.unloaded_since(lease.host, key.model, lease.last_used):
                    home = lease.host
                    loaded = models.loaded_elsewhere(call.candidates, home, key.model)
                    if loaded:
                        hosts = [h for h in call.candidates if h == home or h in loaded]
                        moved = await table.rehome(key, hosts, now, peers, reason="unloaded")
                        if moved is not None:
                            return moved
            if lease is not None and lease.cold:
                moved = await table.rehome(key, call.candidates, now, peers)
                if moved is not None:
                    return moved
        warm = self._unscoped_host(call)
        return await table.acquire(key, call.candidates, now, peers, call.need, warm)

    def _place_batch(self, call: Call) -> Acquired:
        """A batch request's host (`Table.spare`), its shared system prompt's home remembered."""
        key, homes = call.key, self._batch_homes
        prefix = system_digest(call.inbound.body, call.dialect)
        home_key = (key.route, key.model, prefix)
        acquired = self._table.spare(key, call.candidates, homes.get(home_key) if prefix else None)
        if prefix and not acquired.pinned and not acquired.reused:
            homes[home_key] = acquired.host
            homes.move_to_end(home_key)
            if len(homes) > _BATCH_HOMES:
                homes.popitem(last=False)
        return acquired

    def _unscoped_host(self, call: Call) -> str | None:
        """The host of the lease a version without tenant-scoped fingerprints made for this
        conversation (under its unscoped fingerprint, before this instance started), when the
        conversation has no lease of its own yet: its new lease goes there, warm."""
        if not call.unscoped or self._table.lease(call.key) is not None:
            return None
        key = call.key
        old = self._table.lease(Key(key.route, call.unscoped, key.model))
        if old is None or old.created >= self._started:
            return None  # none, or one this version made: an anonymous client's on an open route
        return old.host

    def holder(self, call: Call) -> Lease | None:
        """The lease `call`'s key has now (before `place`), for `explain`."""
        return self._table.lease(call.key)

    def explain(self, call: Call, before: Lease | None, acquired: Acquired) -> tuple[str, str, str]:
        """What `place` decided, for the lease's span: new, reused, pinned or moved; why; and
        the host it moved from ("" when it did not move)."""
        if call.origin is not None and acquired.host == call.origin:
            return "reused", "names a running completion", ""
        if not call.conversation:
            return ("reused" if acquired.reused else "new"), "no conversation: nothing leased", ""
        moved = before is not None and before.host != acquired.host
        origin = before.host if before is not None and moved else ""
        if acquired.pinned:
            return "pinned", "pin", origin
        if before is not None and moved:
            if before.cold:
                why = "cold"
            elif self._models is not None and self._models.unloaded_since(
                before.host, before.key.model, before.last_used
            ):
                why = "unloaded"
            elif before.host not in call.candidates:
                why = "config"
            elif not self._hosts.healthy(before.host):
                why = "unhealthy"
            else:
                why = "moved by another instance"
            return "moved", why, origin
        if acquired.reused:
            return "reused", "own lease" if before is not None else "route lease inherited", ""
        return "new", "chosen", ""

    async def leave(self, call: Call, host: str) -> None:
        """`call`'s answer on `host` was cut, to go on elsewhere (proxy/resume.py): its
        conversation's lease moves off `host` first (event reason `resumed`), so the
        continuation and the turns after it go where the answer went on."""
        if not call.conversation or call.batch:
            return
        now = self._clock.seconds()
        await self._table.leave(call.key, host, call.candidates, now, call.route.peers)

    async def refused(self, call: Call, acquired: Acquired) -> None:
        """crossbar refused `call` after placing it (the context guard): a lease it made goes."""
        if acquired.born:
            await self._undo(call, acquired)

    async def answered(self, call: Call, acquired: Acquired, status: int, tokens: Tokens) -> None:
        """The host answered `call` with `status`: a refused first request leaves no lease; an
        answered inference turn tells what the host kept of its conversation."""
        if refusal(status):
            if acquired.born:
                await self._undo(call, acquired)
            return
        if status != 200 or call.kind is not Kind.INFERENCE or not call.key.fp:
            return  # a route lease is many conversations': no prefix of its own to lose
        if call.batch:
            return  # not a turn of the conversation whose lease it may have run beside
        lease = self._table.lease(call.key)
        if lease is not None and lease.host == acquired.host:
            self._warmth.turn(lease, tokens.prompt, tokens.cached, tokens.completion, call.opening)

    async def _undo(self, call: Call, acquired: Acquired) -> None:
        try:
            await self._table.undo(call.key, acquired.host, self._clock.seconds())
        except Exception:
            # The store refused the delete; the lease stays, which is what a working request
            # would have left: nothing to tell the client, whose answer has gone.
            log.failure("could not forget the lease of a refused request {key}", key=call.key)
