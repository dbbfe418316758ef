"""crossbar as a twistd service: listeners, health and sweep loops, reload, graceful stop."""

from __future__ import annotations

import signal
from typing import Any

from twisted.application.service import MultiService
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import serverFromString
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from crossbar.app import App
from crossbar.build import build_app
from crossbar.config import Config, ConfigError, load_config
from crossbar.logs import log_request
from crossbar.metrics import Metrics
from crossbar.proxy import ProxyResource
from crossbar.site import ProxySite

log = Logger(namespace="crossbar")


def make_service(config: Config, reactor: Any = None, admin_factory: Any = None) -> CrossbarService:
    """crossbar's service for `config` on `reactor` (the global one by default)."""
    if reactor is None:
        from twisted.internet import reactor as default

        reactor = default
    return CrossbarService(config, reactor, admin_factory=admin_factory)


class CrossbarService(MultiService):
    """Builds the app, probes every host once, then opens the proxy (and admin) ports.

    `ready` fires once the ports are open (or errbacks if start-up failed); `proxy_port`
    and `admin_port` are the listening ports then.
    """

    def __init__(self, config: Config, reactor: Any, admin_factory: Any = None) -> None:
        super().__init__()
        self.config = config
        self.reactor = reactor
        self.admin_factory = admin_factory
        self.app: App | None = None
        self.metrics: Metrics | None = None
        self.proxy: ProxyResource | None = None
        self.site: ProxySite | None = None
        self.proxy_port: Any = None
        self.admin_port: Any = None
        self.ready: Deferred[None] = Deferred()
        self._sweep = LoopingCall(self.sweep)
        self._sweep.clock = reactor
        self._starting: Deferred[None] | None = None
        self._previous_sighup: Any = None

    def startService(self) -> None:
        super().startService()
        self._starting = Deferred.fromCoroutine(self._start())
        self._starting.addCallbacks(self.ready.callback, self._start_failed)

    async def _start(self) -> None:
        config = self.config
        self.app = app = await build_app(config, self.reactor)
        app.observers.append(log_request)
        self.metrics = Metrics(app).attach()  # before any traffic: /metrics misses nothing
        # Hosts start healthy; one round of probes (bounded by health_timeout) comes first so a
        # host that is down is known before the first client arrives. Leases are already loaded.
        await app.hosts.start()
        self._sweep.start(config.server.sweep_interval, now=False)
        self.proxy = ProxyResource(app)
        self.site = ProxySite(
            self.proxy, max_body=config.server.max_body, access_log=False, reactor=self.reactor
        )
        endpoint = serverFromString(self.reactor, config.server.listen)
        self.proxy_port = await endpoint.listen(self.site)
        if self.admin_factory is not None:
            admin_site = self.admin_factory(self)
            admin = serverFromString(self.reactor, config.server.admin_listen)
            self.admin_port = await admin.listen(admin_site)
        self._install_sighup()
        log.info(
            "crossbar listening on {listen} (admin {admin}); {hosts} hosts, {leases} leases",
            listen=config.server.listen,
            admin=config.server.admin_listen,
            hosts=len(config.hosts),
            leases=len(app.table.snapshot()),
        )

    def _start_failed(self, failure: Any) -> None:
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

    async def sweep(self) -> None:
        """Expire idle leases and prune old events and usage. Never raises (it would stop)."""
        app = self.app
        if app is None:
            return
        try:
            now = self.reactor.seconds()
            s = app.config.server
            expired = await app.table.expire_idle(now)
            events, usage = await app.store.prune(now - s.events_retention, now - s.usage_retention)
            if expired or events or usage:
                log.info(
                    "sweep: {expired} leases expired; pruned {events} events, {usage} usage rows",
                    expired=expired,
                    events=events,
                    usage=usage,
                )
        except Exception:
            log.failure("sweep failed; it runs again next interval")

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
        """Switch to a validated config without dropping in-flight requests."""
        app = self.app
        assert app is not None
        old = self.config
        notes = [
            f"server.{key} changed; it takes effect at restart"
            for key in ("listen", "admin_listen", "db")
            if getattr(old.server, key) != getattr(new.server, key)
        ]
        removed = set(old.hosts) - set(new.hosts)
        self.config = app.config = new
        app.hosts.reconfigure(new)
        s = new.server
        app.limiter.configure(s.queue_max, s.queue_timeout)
        app.upstream.idle_timeout = s.upstream_idle_timeout
        app.upstream.set_connect_timeout(s.upstream_connect_timeout)
        app.table.set_idle(s.lease_idle)
        app.ids.size, app.ids.ttl = s.remember_ids, s.lease_idle
        if self._sweep.running and s.sweep_interval != old.server.sweep_interval:
            self._sweep.stop()
            self._sweep.start(s.sweep_interval, now=False)
        if self.site is not None:
            self.site.max_body = new.server.max_body
        if removed:
            dropped = await app.table.drop_hosts(removed, self.reactor.seconds())
            for host in removed:
                app.ids.forget_host(host)
            notes.append(f"hosts removed: {', '.join(sorted(removed))} ({dropped} leases dropped)")
        for note in notes:
            log.warn("reload: {note}", note=note)
        log.info("config reloaded from {path}", path=new.path or "(memory)")
        return notes

    def stopService(self) -> Deferred[None]:
        super().stopService()
        return Deferred.fromCoroutine(self._stop())

    async def _stop(self) -> None:
        """Stop accepting, let running requests finish for shutdown_grace, abort the rest."""
        if self._starting is not None and not self._starting.called:
            self._starting.cancel()
        if self._previous_sighup is not None:
            signal.signal(signal.SIGHUP, self._previous_sighup)
        for port in (self.proxy_port, self.admin_port):
            if port is not None:
                await port.stopListening()
        if self._sweep.running:
            self._sweep.stop()
        app = self.app
        if app is None:
            return
        await app.hosts.stop()
        if self.proxy is not None:
            await self.proxy.drain(self.config.server.shutdown_grace)
        await app.upstream.close()
        await app.store.close()  # last: every row written before the stop is kept
        log.info("crossbar stopped")
