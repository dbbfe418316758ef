"""crossbar as a twistd service: parts, listeners and timers composed; reload; graceful stop.

`CrossbarService` is a MultiService. Starting it builds the parts (the store opens, leases and
pins come back), then adds its children in order: the probe timer (its first round runs at
once, and the proxy port opens only after it, so a host that is down is known before the first
client), the sweep timer, the proxy listener and the admin listener. A reload calls
`reconfigure(config)` on each part in turn. A stop closes the listeners, stops the timers,
gives running requests `shutdown_grace` and aborts the rest, then closes the upstream pool and,
last, the store.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from twisted.application.internet import StreamServerEndpointService, TimerService
from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort, IStreamServerEndpoint
from twisted.logger import ILogObserver, Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IAgentEndpointFactory
from zope.interface import implementer

from crossbar import build
from crossbar.app.systemd import Notifier, Watchdog, watchdog_period
from crossbar.app.wiring import Parts, Reconfigurable, Sites, build_parts, make_sites
from crossbar.batches import TICK as BATCH_TICK
from crossbar.cluster import FOLLOW_EVERY
from crossbar.config import Config, ConfigError, load_config, with_backlog
from crossbar.handoff import TICK as REBALANCE_TICK
from crossbar.hosts import Hosts, ProbeSchedule
from crossbar.store import Store
from crossbar.tenants import SYNC_EVERY

log = Logger(namespace="crossbar")
_RESTART_KEYS = ("listen", "admin_listen", "listen_backlog", "db", "handoff_store")


def _guarded(fn: Callable[[], Any], what: str) -> Callable[[], Deferred[Any]]:
    """`fn` for a timer: an error is logged, never raised (it would stop the timer)."""

    def call() -> Deferred[Any]:
        d = maybeDeferred(fn)
        d.addErrback(lambda f: log.failure("{what} failed; it runs again next time", f, what=what))
        return d

    return call


class Every(TimerService):
    """Runs `fn` every `step(config)` seconds on `clock`, the first time at start; a reload
    may change the step. `fn` never stops it."""

    def __init__(
        self, name: str, step: Callable[[Config], float], config: Config, fn: Any, clock: Any
    ) -> None:
        super().__init__(step(config), _guarded(fn, name))
        self.setName(name)
        self.clock = clock
        self._step_of = step

    async def reconfigure(self, config: Config) -> None:
        """Take the reloaded step (a new period starts now)."""
        step = self._step_of(config)
        if step == self.step:
            return
        if self.running:
            await self.stopService()
            self.step = step
            self.startService()
        else:
            self.step = step


@implementer(IStreamServerEndpoint)
class _Announcing:
    """An endpoint whose `listening` fires with the port (or the failure to listen)."""

    def __init__(self, endpoint: IStreamServerEndpoint) -> None:
        self._endpoint = endpoint
        self.listening: Deferred[IListeningPort] = Deferred()

    def listen(self, factory: Any) -> Deferred[IListeningPort | None]:
        def bad(failure: Failure) -> None:
            self.listening.errback(failure)  # start-up reports it; not logged twice

        def good(port: IListeningPort) -> IListeningPort:
            self.listening.callback(port)
            return port

        return self._endpoint.listen(factory).addCallbacks(good, bad)


class CrossbarService(MultiService):
    """The whole of one crossbar. `ready` fires once both ports listen (or errbacks when
    start-up failed); `proxy_port` and `admin_port` are the ports then."""

    def __init__(
        self,
        config: Config,
        reactor: Any,
        store: Store | None = None,
        endpoints: IAgentEndpointFactory | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        """`store` and `endpoints` replace the database and TCP to the hosts in tests;
        `environ` says whether systemd asked to be notified (app/systemd.py)."""
        super().__init__()
        self._notifier = Notifier.from_environ(environ)
        self._watchdog = watchdog_period(environ)
        self.config = config
        self._running = config.server  # listeners and store as started: a reload keeps them
        self._tracing = config.tracing  # so is the tracer
        self.reactor = reactor
        self._store = store
        self._endpoints = endpoints
        self.parts: Parts | None = None
        self.sites: Sites | None = None
        self.proxy_port: IListeningPort | None = None
        self.admin_port: IListeningPort | None = None
        self.ready: Deferred[None] = Deferred()
        self._starting: Deferred[None] | None = None
        self._previous_sighup: Any = None
        # What twistd logs to, when the plugin chose it (app/tap.py): set on the application
        # this service joins, which is where twistd looks before making its own.
        self.log_observer: Any = None

    def setServiceParent(self, parent: Any) -> None:
        if self.log_observer is not None and hasattr(parent, "setComponent"):
            parent.setComponent(ILogObserver, self.log_observer)
        super().setServiceParent(parent)

    def startService(self) -> None:
        # The children are added (and so started) by _start, once the parts exist.
        Service.startService(self)
        self._starting = Deferred.fromCoroutine(self._start())
        self._starting.addCallbacks(self.ready.callback, self._start_failed)

    async def _start(self) -> None:
        config, reactor = self.config, self.reactor
        s = config.server
        self.parts = parts = await build_parts(config, reactor, self._store, self._endpoints)
        self.sites = sites = make_sites(config, parts, self.reload)
        await parts.hosts.probe_all()  # every host at once: the proxy port waits for it
        probes = probe_timer(config, parts.hosts, reactor)
        probes.setServiceParent(self)  # then each host at its own phase of the interval
        sweeper = Every("sweep", _sweep_interval, config, parts.sweep.run, reactor)
        sweeper.setServiceParent(self)
        # Other instances sharing the store: their changes, and this one's slot share, known
        # before the first client is served.
        await parts.instances.beat()
        await parts.follower.run()
        follow = Every("follow", _follow_every, config, parts.follower.run, reactor)
        follow.setServiceParent(self)
        beats = Every("heartbeat", _health_interval, config, parts.instances.beat, reactor)
        beats.setServiceParent(self)
        spend = Every("keys", _sync_every, config, parts.tenants.sync, reactor)
        spend.setServiceParent(self)
        rebalance = Every(
            "rebalance", _rebalance_every, config, parts.handoff.rebalancer.tick, reactor
        )
        rebalance.setServiceParent(self)
        batches = Every("batches", _batch_tick, config, parts.batches.tick, reactor)
        batches.setServiceParent(self)
        self.proxy_port = await self._listen("proxy", s.listen, sites.proxy)
        self.admin_port = await self._listen("admin", s.admin_listen, sites.admin)
        address = self.proxy_port.getHost()
        parts.instances.address = f"{getattr(address, 'host', '')}:{getattr(address, 'port', '')}"
        if self._notifier is not None:
            self._notifier.send("READY=1")
            if self._watchdog is not None:
                Watchdog(self._notifier, self._watchdog, reactor).setServiceParent(self)
        self._install_sighup()
        log.info(
            "crossbar listening on {listen} (admin {admin}); {hosts} hosts, {leases} leases; "
            "build {build}",
            listen=s.listen,
            admin=s.admin_listen,
            hosts=len(config.hosts),
            leases=len(parts.table),
            build=build.describe(),
        )

    async def _listen(self, name: str, description: str, site: Any) -> IListeningPort:
        description = with_backlog(description, self.config.server.listen_backlog)
        endpoint = _Announcing(serverFromString(self.reactor, description))
        listener = StreamServerEndpointService(endpoint, site)
        listener.setName(name)
        listener.setServiceParent(self)
        return await endpoint.listening

    def _start_failed(self, failure: Failure) -> None:
        log.failure("crossbar could not start", failure)
        self.ready.errback(failure)
        if getattr(self.reactor, "running", False) and self.running:
            self.reactor.stop()

    def _install_sighup(self) -> None:
        if not hasattr(signal, "SIGHUP") or not getattr(self.reactor, "running", False):
            return
        try:
            self._previous_sighup = signal.signal(
                signal.SIGHUP, lambda *_: self.reactor.callFromThread(self._sighup)
            )
        except ValueError:  # not the main thread
            self._previous_sighup = None

    def _sighup(self) -> None:
        d = Deferred.fromCoroutine(self.reload())
        d.addErrback(lambda f: f.trap(ConfigError))  # already logged, the old config stays

    async def reload(self) -> list[str]:
        """Read the config file again and apply it; a bad file raises ConfigError (and is
        logged), and the old config stays. Returns notes for the operator."""
        try:
            new = load_config(self.config.path)
        except ConfigError as e:
            for line in e.errors:
                log.error("reload refused: {error}", error=line)
            raise
        return await self.apply(new)

    async def apply(self, new: Config) -> list[str]:
        """Switch every part to a validated config without dropping in-flight requests."""
        old = self.config
        # Said on every reload while the file and the running value differ, not only the first.
        notes = [
            f"server.{key} changed; it takes effect at restart"
            for key in _RESTART_KEYS
            if getattr(self._running, key) != getattr(new.server, key)
        ]
        if new.tracing != self._tracing:
            notes.append("[tracing] changed; it takes effect at restart")
        removed = sorted(set(old.hosts) - set(new.hosts))
        assert self.parts is not None and self.sites is not None
        table = self.parts.table
        dropped = sum(table.count_where(None, host, None) for host in removed)
        self.config = new
        # Every part that takes a reload, through the one mechanism: the parts in the order
        # they were built, the sites, then the timers among this service's children.
        timers = [child for child in self if isinstance(child, Reconfigurable)]
        for part in [*self.parts.reloadable(), *self.sites.reloadable(), *timers]:
            result = part.reconfigure(new)
            if isinstance(result, Awaitable):
                await result
        if removed:
            notes.append(f"hosts removed: {', '.join(removed)} ({dropped} leases dropped)")
        for note in notes:
            log.warn("reload: {note}", note=note)
        log.info("config reloaded from {path}", path=new.path or "(memory)")
        return notes

    def stopService(self) -> Deferred[None]:
        return Deferred.fromCoroutine(self._stop())

    async def _stop(self) -> None:
        """Stop accepting, let running requests finish for shutdown_grace, abort the rest."""
        if self._notifier is not None:
            self._notifier.send("STOPPING=1")
        if self._starting is not None and not self._starting.called:
            self._starting.cancel()
        if self._previous_sighup is not None:
            signal.signal(signal.SIGHUP, self._previous_sighup)
            self._previous_sighup = None
        parts = self.parts
        if parts is not None:
            parts.hosts.stop()  # probes under way end now, so the probe timer stops at once
        if parts is not None:
            parts.batches.halt()  # no more items claimed: those running may finish
        await MultiService.stopService(self)  # the listeners, then the timers
        if parts is None:
            return
        if self.sites is not None:
            aborted = await self.sites.resource.drain(self.config.server.shutdown_grace)
            if aborted:
                log.warn("stop: {n} requests aborted after shutdown_grace", n=aborted)
        await parts.batches.stop()  # results written, the claims left given back
        await parts.usage.flush()  # the rows still waiting for their write
        await parts.tenants.sync()  # what the keys spent, for the other instances
        await parts.upstream.close()
        if parts.tracing is not None:
            await parts.tracing.close()  # the last spans exported, the thread stopped
        parts.handoff.close()
        await parts.instances.leave()
        parts.journal.stop()
        await parts.store.close()  # last: every row written before the stop is kept
        log.info("crossbar stopped")


def _health_interval(config: Config) -> float:
    return config.server.health_interval


def probe_timer(config: Config, hosts: Hosts, clock: Any) -> ProbeSchedule:
    """Each host probed every `health_interval` at its own phase (hosts/schedule.py); a slow
    probe delays that host's next one instead of overlapping it."""
    return ProbeSchedule(config, hosts, clock)


def _follow_every(config: Config) -> float:
    return FOLLOW_EVERY


def _sync_every(config: Config) -> float:
    return SYNC_EVERY


def _rebalance_every(config: Config) -> float:
    return REBALANCE_TICK


def _batch_tick(config: Config) -> float:
    return BATCH_TICK


def _sweep_interval(config: Config) -> float:
    return config.server.sweep_interval


def make_service(
    config: Config, reactor: Any = None, store: Store | None = None
) -> CrossbarService:
    """crossbar's service for `config` on `reactor` (the global one by default)."""
    if reactor is None:
        from twisted.internet import reactor as default

        reactor = default
    return CrossbarService(config, reactor, store=store)
