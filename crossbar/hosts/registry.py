"""The configured hosts: health (active probes and passive failures), draining, slots
(docs/reference.md, "Hosts").

Hosts start healthy, so a restart moves no lease. A probe is `GET <url>/health` within
`health_timeout`: 200 is good, anything else (503 "Loading model" included), a timeout or a
connection error is bad. `unhealthy_after` bad probes in a row flip a healthy host, and
`healthy_after` good ones flip it back; the proxy's `passive_failure` flips it at once. After a
good probe, `/props` is read (until it has succeeded once, and again after the host was down, as
a restarted llama-server may have other settings) for `total_slots` and `n_ctx` where the config
leaves `parallel`/`ctx` unset. A host with `models = "discover"` has its `GET /models` read after
every good probe (a router-mode llama-server loads and unloads models as it goes), and `/props`
of each model once it is loaded (catalog.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

from treq.client import HTTPClient
from twisted.internet.defer import CancelledError, Deferred, gatherResults, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import HTTPConnectionPool
from twisted.web.iweb import IAgentEndpointFactory

from crossbar.config import Config, ModelConfig, Route
from crossbar.hosts.catalog import Serving
from crossbar.hosts.discovery import discover
from crossbar.hosts.entry import HostEntry, fresh_residency
from crossbar.hosts.health import Getter, Poster, Prober, build_client, treq_getter, treq_poster
from crossbar.hosts.lean_get import LeanGetter
from crossbar.hosts.residency import KEEP, ModelEvent, Residency
from crossbar.hosts.router import RouterControl
from crossbar.hosts.status import host_status

Listener = Callable[[str, str], None]
ModelListener = Callable[[ModelEvent], None]
_MODEL_EVENTS = 1000  # the latest model loads and unloads kept for the admin API
_SERVING_MAX = 4096  # routes whose Serving is kept (templates resolve to many names)


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


class DrainStore(Protocol):
    """What Hosts needs of the store: the persisted draining flags."""

    async def set_draining(self, name: str, draining: bool) -> None: ...

    async def list_draining(self) -> set[str]: ...


class NoSuchHost(KeyError):
    """No configured host has this name."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown host {self.name!r}"


class Hosts:
    """Registry of the configured hosts with their health, draining and slot counts."""

    def __init__(
        self,
        config: Config,
        clock: IReactorTime,
        store: DrainStore | None = None,
        http: HTTPClient | None = None,
        log: Logger | None = None,
        *,
        get: Getter | None = None,
        post: Poster | None = None,
        endpoints: IAgentEndpointFactory | None = None,
    ) -> None:
        """`clock` is the reactor in production. `get` (and `post`, a router's load and
        unload) replace HTTP in tests; without `get`, `http` (or, when None, a client on a
        pool of our own, closed by `stop`, over `endpoints` when given: an in-memory
        network's) is used for both."""
        self._config = config
        self._clock = clock
        self._store = store
        self._log = log or Logger()
        self._pool: HTTPConnectionPool | None = None
        self._lean: LeanGetter | None = None
        if get is None:
            if http is None:
                http, self._pool = build_client(clock, endpoints)
            get = treq_getter(http)
            if endpoints is None:
                # /health on kept bare TCP connections (a tenth of treq's CPU); the rest
                # through treq.
                get = self._lean = LeanGetter(clock, get)
            post = post or treq_poster(http)
        self._get = get
        self.router = RouterControl(self._host, self.tell_models, clock, post, self._log)
        # Told each model load and unload seen or caused on a router-mode host.
        self.model_listeners: list[ModelListener] = []
        self.model_events: deque[ModelEvent] = deque(maxlen=_MODEL_EVENTS)
        self._hosts = {name: HostEntry(h) for name, h in config.hosts.items()}
        self._draining: set[str] = set()
        self._listeners: list[Listener] = []
        self._round_waiters: list[Deferred[None]] = []
        self._probing: dict[str, Deferred[None]] = {}
        self._fresh: set[str] = set()  # added or moved by a reload, not probed since
        self.probe_errors = 0  # bugs caught in a probe round (a probe that fails is not one)
        self._serving: dict[str, Serving] = {}

    # -- reading

    def names(self) -> list[str]:
        """Host names in config order."""
        return list(self._hosts)

    def healthy(self, name: str) -> bool:
        host = self._hosts.get(name)
        return host is not None and host.health.healthy

    def draining(self, name: str) -> bool:
        return name in self._draining

    def models(self, name: str) -> tuple[ModelConfig, ...]:
        """The models the host serves now: configured, or (`models = "discover"`) what its
        `GET /models` last listed; none for a host the config does not have."""
        host = self._hosts.get(name)
        return host.catalog.models() if host is not None else ()

    def serving(self, route: Route) -> Serving:
        """The models `route`'s hosts serve now, and the hosts serving each, in route order:
        worked out again only when some host's models changed (asked on every request)."""
        listings = tuple(self.models(h) for h in route.hosts)
        known = self._serving.get(route.name)
        if known is not None and known.route is route and _same(known.listings, listings):
            return known
        serving = Serving.of(route, listings)
        if len(self._serving) >= _SERVING_MAX:
            self._serving.clear()
        self._serving[route.name] = serving
        return serving

    def model(self, name: str, model: str) -> ModelConfig | None:
        """The host's `model`, if it serves it now."""
        host = self._hosts.get(name)
        return host.catalog.model(model) if host is not None else None

    def parallel(self, name: str, model: str) -> int:
        """Slots: configured, else discovered `total_slots`, else 1 (also for unknown pairs,
        which the limiter may still ask about while requests drain after a reload)."""
        host = self._hosts.get(name)
        return host.catalog.parallel(model) if host is not None else 1

    def knows_parallel(self, name: str, model: str) -> bool:
        """Whether the pair's slots are known yet (configured or read from `/props`)."""
        host = self._hosts.get(name)
        return host is not None and host.catalog.knows_parallel(model)

    def ctx(self, name: str, model: str) -> int | None:
        """Tokens per slot: configured, else discovered `n_ctx`, else None (unknown)."""
        host = self._hosts.get(name)
        return host.catalog.ctx(model) if host is not None else None

    # -- router mode: which models a host has loaded

    def residency(self, name: str) -> Residency | None:
        """What a router-mode host has loaded (None for any other host)."""
        host = self._hosts.get(name)
        return None if host is None else host.residency

    def capacity(self, name: str) -> int | None:
        """Models a router-mode host holds at once; None: no limit known (or not a router)."""
        residency = self.residency(name)
        return None if residency is None else residency.capacity

    def running(self, name: str) -> list[str]:
        """The models holding a router's places now, least recently used first."""
        residency = self.residency(name)
        return [] if residency is None else residency.running()

    def kept(self, name: str) -> Collection[str]:
        """The host's `keep_loaded` models."""
        host = self._hosts.get(name)
        return () if host is None else host.config.keep_loaded

    def swap_after(self, name: str) -> float | None:
        """The host's `swap_after` (None: unset, the swap gate's own bound)."""
        host = self._hosts.get(name)
        return host.config.swap_after if host is not None else None

    def model_state(self, name: str, model: str) -> str | None:
        """A router-mode host's model's state as crossbar knows it (None for other hosts)."""
        residency = self.residency(name)
        return None if residency is None else residency.state(model)

    def tell_models(self, events: Sequence[ModelEvent]) -> None:
        """Loads and unloads seen or caused: logged, kept for the admin API, and told to each
        model listener."""
        for event in events:
            self.model_events.append(event)
            self._log.info(
                "host {host} model {model}: {kind} ({reason})", host=event.host,
                model=event.model, kind=event.kind, reason=event.reason,
            )  # fmt: skip
            for fn in list(self.model_listeners):
                try:
                    fn(event)
                except Exception:
                    self._log.failure("model listener failed on {event}", event=event)

    def held_down(self, name: str) -> bool:
        """True while a host is held out of new placements: it flapped (flaps.py), or it has
        not answered a probe since it came into the config (start or reload) though one was
        tried. It keeps its leases either way; a restart moves nobody."""
        host = self._hosts.get(name)
        if host is None:
            return False
        return host.health.unproven or host.flaps.held(self._clock.seconds())

    @property
    def flips(self) -> dict[str, int]:
        """Health flips per host since start (for metrics)."""
        return {name: h.health.flips for name, h in self._hosts.items()}

    def status(self) -> list[dict[str, Any]]:
        """Every host for the admin API, in config order. Never includes the api key."""
        now, window = self._clock.seconds(), self._config.server.flap_window
        return [
            host_status(name, h, name in self._draining, now, window)
            for name, h in self._hosts.items()
        ]

    # -- draining

    async def load_draining(self) -> None:
        """Restore the draining flags from the store (at start)."""
        if self._store is not None:
            self._draining = set(await self._store.list_draining())

    async def drain(self, name: str) -> None:
        """Stop giving the host new leases; persisted before it takes effect."""
        await self._set_draining(name, True)

    async def undrain(self, name: str) -> None:
        await self._set_draining(name, False)

    async def _set_draining(self, name: str, draining: bool) -> None:
        self._host(name)
        if self._store is not None:
            await self._store.set_draining(name, draining)
        if draining:
            self._draining.add(name)
        else:
            self._draining.discard(name)
        self._log.info(
            "host {host} {what}", host=name, what="draining" if draining else "undrained"
        )

    def remote_draining(self, name: str, draining: bool) -> None:
        """Another instance sharing the store drained or undrained `name` (already saved)."""
        if draining == (name in self._draining):
            return
        (self._draining.add if draining else self._draining.discard)(name)
        what = "draining" if draining else "undrained"
        self._log.info("host {host} {what} (by another instance)", host=name, what=what)

    def replace_draining(self, names: set[str]) -> None:
        """The store's draining flags, after a reload of its whole state."""
        self._draining = set(names)

    # -- health

    def passive_failure(self, name: str, reason: str, route_hosts: Sequence[str] = ()) -> bool:
        """The proxy could not reach the host (refused, connect timeout): unhealthy at once,
        unless it is the last healthy one of `route_hosts` (passive ejection never empties a
        route; the probes judge that host). `healthy_after` good probes bring it back.
        True when the host was taken out."""
        host = self._hosts.get(name)
        if host is None or not host.health.healthy:
            return False
        others = [h for h in route_hosts if h != name and self.healthy(h)]
        if route_hosts and not others:
            self._log.warn(
                "host {host} failed ({reason}) but is the last healthy host of its route: "
                "kept in service until the probes say otherwise",
                host=name,
                reason=reason,
            )
            return False
        if host.health.fail(reason, self._config.server.unhealthy_after):
            self._flipped(name, host)
        return True

    def probe_all(self) -> Deferred[None]:
        """One probe round over every host in parallel; fires when all have answered or timed
        out. Never fails (a bug in a round is logged and counted in `probe_errors`), so a
        timer may call it forever. A call while a round runs joins that round."""
        waiter: Deferred[None] = Deferred()
        self._round_waiters.append(waiter)
        if len(self._round_waiters) == 1:
            try:
                Deferred.fromCoroutine(self._round())
            except Exception:
                self.probe_errors += 1
                self._log.failure("health probe round failed to start")
                self._end_round()
        return waiter

    def probe(self, name: str) -> Deferred[None]:
        """Probe one host now (the spread schedule's step, schedule.py); joins a probe
        of it under way. Never fails; fires at once for a host the config no longer has."""
        host = self._hosts.get(name)
        if host is None:
            return succeed(None)
        running = self._probing.get(name)
        if running is None:
            try:
                running = self._start_probe(name, host)
            except Exception:
                self.probe_errors += 1
                self._log.failure("health probe of {host} failed to start", host=name)
                return succeed(None)
        done: Deferred[None] = Deferred()

        def finished(result: Any) -> Any:
            if isinstance(result, Failure):
                self.probe_errors += 1
                self._log.failure("health probe of {host} failed", result, host=name)
            done.callback(None)
            return result if not isinstance(result, Failure) else None

        running.addBoth(finished)
        return done

    def stop(self) -> Deferred[None]:
        """Abandon probes under way and close our own connections."""
        for d in list(self._probing.values()):
            d.cancel()
        if self._lean is not None:
            self._lean.close()
        if self._pool is not None:
            return self._pool.closeCachedConnections()
        return succeed(None)

    # -- reload

    def add_listener(self, fn: Listener) -> None:
        """Call `fn(host, model)` whenever the effective `parallel` of the pair changes."""
        self._listeners.append(fn)

    def reconfigure(self, config: Config) -> Deferred[None]:
        """Take a reloaded config: new hosts start healthy, removed ones are forgotten, the
        rest keep their health. Listeners hear about every pair whose parallel changed. The
        hosts it adds or gives another URL are probed at once: the Deferred fires when they
        have been (a reload waits for it, so nothing is placed on them blind)."""
        before = self._parallels()
        hosts: dict[str, HostEntry] = {}
        for name, new in config.hosts.items():
            host = self._hosts.get(name)
            if host is None:
                host = HostEntry(new)
                self._fresh.add(name)
                self._log.info("host {host} added", host=name)
            elif host.config != new:
                if host.config.url != new.url:
                    host.health.epoch += 1
                    host.health.last, host.health.proven = None, False  # another server
                    self._fresh.add(name)
                # Models or their settings may have changed: what a new URL said is unknown.
                host.catalog = host.catalog.reconfigured(new)
                if host.config.url != new.url or host.config.discover != new.discover:
                    host.residency = fresh_residency(new)
                elif host.residency is not None:
                    host.residency.configured = new.max_loaded
                host.config = new
            hosts[name] = host
        for name in self._hosts.keys() - hosts.keys():
            self._log.info("host {host} removed", host=name)
            probe = self._probing.get(name)
            if probe is not None:
                probe.cancel()
        self._hosts = hosts
        self._config = config
        self._fresh &= hosts.keys()
        self._notify(before)
        return Deferred.fromCoroutine(self.probe_fresh())

    async def probe_fresh(self) -> None:
        """Probe at once the hosts a reload added or gave another URL (their `/props` too),
        so nothing is placed on them blind; the spread schedule takes them on from there."""
        fresh, self._fresh = sorted(self._fresh), set()
        await gatherResults([self.probe(name) for name in fresh])

    # -- internals

    def _host(self, name: str) -> HostEntry:
        host = self._hosts.get(name)
        if host is None:
            raise NoSuchHost(name)
        return host

    def _parallels(self) -> dict[tuple[str, str], int]:
        return {
            (name, m.name): host.catalog.parallel(m.name)
            for name, host in self._hosts.items()
            for m in host.catalog.models()
        }

    def _notify(self, before: Mapping[tuple[str, str], int]) -> None:
        for pair, parallel in self._parallels().items():
            if before.get(pair) == parallel:
                continue
            for fn in list(self._listeners):
                try:
                    fn(*pair)
                except Exception:
                    self._log.failure("parallel listener failed for {pair}", pair=pair)

    async def _round(self) -> None:
        try:
            probes = [self._start_probe(name, host) for name, host in self._hosts.items()]
            await gatherResults(probes, consumeErrors=True)
        except Exception:
            # A bug in a probe; the round is over all the same and its waiters must hear.
            self.probe_errors += 1
            self._log.failure("health probe round failed")
        finally:
            self._end_round()

    def _end_round(self) -> None:
        waiters, self._round_waiters = self._round_waiters, []
        for w in waiters:
            if not w.called:
                w.callback(None)

    def _start_probe(self, name: str, host: HostEntry) -> Deferred[None]:
        d = Deferred.fromCoroutine(self._probe(name, host))
        self._probing[name] = d

        def done(result: Any) -> Any:
            if self._probing.get(name) is d:
                del self._probing[name]
            return result

        def cancelled(failure: Failure) -> None:
            failure.trap(CancelledError)  # by stop or reconfigure: the round goes on without it

        return d.addErrback(cancelled).addBoth(done)

    async def _probe(self, name: str, host: HostEntry) -> None:
        epoch = host.health.epoch
        probe = await self._prober().check(host.config)
        if self._hosts.get(name) is not host or host.health.epoch != epoch:
            return  # removed, moved or passively failed while we waited
        server = self._config.server
        if host.health.record(probe, server.unhealthy_after, server.healthy_after):
            self._flipped(name, host)
        elif not host.health.healthy and host.flaps.still_down(self._clock.seconds()):
            down, failed = host.flaps.summary(self._clock.seconds())
            self._log.warn(
                "host {host} still unhealthy after {down:.0f}s ({failed} probes failed since "
                "the last line; last: {reason})",
                host=name,
                down=down,
                failed=failed,
                reason=probe.reason,
            )
        if probe.ok and (host.config.discover or host.catalog.wanting_props()):
            await self._discover(name, host)

    def _flipped(self, name: str, host: HostEntry) -> None:
        reason, now, s = host.health.reason, self._clock.seconds(), self._config.server
        if host.health.healthy:
            hold = host.flaps.rose(now, s.flap_window, s.flap_holddown, s.flap_holddown_max)
            if hold:
                reason += f"; flapping, held out of new placements for {hold:g}s"
            self._log.info("host {host} is healthy again: {reason}", host=name, reason=reason)
        else:
            host.flaps.fell(now, s.flap_window)
            # It may come back restarted with other settings: read /props again then.
            host.catalog.props_done = False
            if host.residency is not None:
                host.residency.props_read = False
            self._log.warn("host {host} is unhealthy: {reason}", host=name, reason=reason)

    async def _discover(self, name: str, host: HostEntry) -> None:
        before = self._parallels()
        current = lambda: self._hosts.get(name) is host  # noqa: E731 - not removed meanwhile
        if await discover(self._prober(), name, host, self._log, current, self.tell_models):
            self._notify(before)
        if current() and host.health.healthy:
            self.router.keep(name, host, KEEP)

    def _prober(self) -> Prober:
        return Prober(self._get, self._clock, self._config.server.health_timeout)
