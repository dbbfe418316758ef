"""The operator's actions: release, pin, unpin, drain, evacuate, reload, and a router-mode
host's model load and unload (docs/operator-guide.md, "Leases, pins, draining"). Each is made
durable before it is acknowledged, and refused (503) while the store cannot be written (a
model's load and unload are the router's: nothing of them is stored). Plain methods: the
routes that call them are api.py's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from crossbar.config import Config, ConfigError
from crossbar.handoff import Evacuator
from crossbar.hosts import Hosts, NoSuchHost, NotARouter, RouterRefused, UnknownModel
from crossbar.leases import Table
from crossbar.wire import ClientError, bad_request, not_found

log = Logger(namespace="crossbar.admin")
Reload = Callable[[], Awaitable[list[str]]]


class ReloadRefused(Exception):
    """The config file is bad; `errors` are its problems, dotted paths first."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


class Actions:
    """What changes what crossbar does; each takes the config it acts under."""

    def __init__(
        self,
        clock: IReactorTime,
        table: Table,
        hosts: Hosts,
        reload: Reload,
        evacuator: Evacuator | None,
    ) -> None:
        self._clock = clock
        self._table = table
        self._hosts = hosts
        self._reload = reload
        self._evacuator = evacuator

    async def release(self, config: Config, route: str) -> dict[str, Any]:
        """Drop the route's leases."""
        self._known_route(config, route)
        released = await self._table.release(route, self._clock.seconds())
        log.info("admin: released {n} leases of route {route}", n=released, route=route)
        return {"route": route, "released": released}

    async def pin(self, config: Config, route: str, body: dict[str, Any]) -> dict[str, Any]:
        """Pin the route to `body["host"]`, one of the route's configured hosts."""
        host = body.get("host")
        if not isinstance(host, str) or not host:
            raise bad_request('give the host to pin to as {"host": "<name>"}')
        resolved = config.route(route)
        if resolved is None:
            raise not_found(f"no route or template serves {route!r}")
        if host not in resolved.hosts:
            # Only the route's configured host names: a pin never sends a route somewhere its
            # config does not allow.
            raise ClientError(
                409,
                "invalid_request_error",
                f"host {host!r} is not one of route {route!r}'s hosts "
                f"({', '.join(resolved.hosts)}); pin to one of those by name",
            )
        self._table.note_candidates(route, resolved.hosts)
        await self._table.pin(route, host, self._clock.seconds())
        log.info("admin: route {route} pinned to {host}", route=route, host=host)
        return {"route": route, "pinned": host, "healthy": self._hosts.healthy(host)}

    async def unpin(self, config: Config, route: str) -> dict[str, Any]:
        """Remove the route's pin; its leases stay."""
        self._known_route(config, route)
        table = self._table
        previous = table.pinned(route)
        await table.unpin(route, self._clock.seconds())
        if previous is not None:
            log.info("admin: route {route} unpinned from {host}", route=route, host=previous)
        return {"route": route, "unpinned": previous}

    async def drain(self, name: str, draining: bool, grace: float | None = None) -> dict[str, Any]:
        """Drain (no new leases) or undrain a host. With a `grace` (seconds), the host's
        running streams are stopped when it ends, each to go on elsewhere, unless the host
        is undrained before; an undrain forgets it."""
        hosts, evacuator = self._hosts, self._evacuator
        if grace is not None and evacuator is None:
            raise not_found("this crossbar cannot move running answers")
        try:
            await (hosts.drain(name) if draining else hosts.undrain(name))
        except NoSuchHost:
            raise not_found(f"no host named {name!r} in the config") from None
        answer: dict[str, Any] = {"host": name, "draining": hosts.draining(name)}
        if evacuator is None:
            return answer
        if not draining:
            if evacuator.cancel_grace(name):
                log.info("admin: {host} undrained: its running answers stay", host=name)
            return answer
        if grace is not None:
            stopped = evacuator.stop_after(name, grace)
            log.info("admin: {host} drained; its running answers move in {grace}s",
                     host=name, grace=grace)  # fmt: skip
            # `stopped` now (a grace of 0); `streaming`: those the grace's end would stop.
            answer.update(grace=grace, stopped=stopped, streaming=evacuator.streaming(name))
        return answer

    async def evacuate(self, name: str, now: bool = False) -> dict[str, Any]:
        """Drain the host and move its conversations away, each prewarmed on its new host;
        with `now`, its running streams too, each continued on its conversation's new host."""
        if self._evacuator is None:
            raise not_found("this crossbar cannot evacuate hosts")
        try:
            evacuation = await self._evacuator.start(name, now=now)
        except NoSuchHost:
            raise not_found(f"no host named {name!r} in the config") from None
        log.info("admin: evacuating {host}{now}", host=name, now=" now" if now else "")
        return {"host": name, "draining": True, "evacuation": evacuation.view()}

    async def model(self, name: str, model: str, load: bool) -> dict[str, Any]:
        """Load (or unload) `model` on router-mode host `name` through the router's own API;
        the model's state as crossbar knows it after. 404 for an unknown host or model, 409
        for a host that is not a router, 502 when the router refused or did not answer."""
        router = self._hosts.router
        try:
            state = await (router.load(name, model) if load else router.unload(name, model))
        except NoSuchHost:
            raise not_found(f"no host named {name!r} in the config") from None
        except NotARouter:
            raise ClientError(
                409, "invalid_request_error",
                f"host {name!r} is not a router-mode host (models = \"discover\")",
            ) from None  # fmt: skip
        except UnknownModel:
            raise not_found(f"host {name!r} does not list model {model!r}") from None
        except RouterRefused as e:
            what = "load" if load else "unload"
            raise ClientError(502, "bad_gateway", f"host {name!r} did not {what} {model!r}: "
                              f"{e.reason}") from None  # fmt: skip
        log.info("admin: host {host} {what} {model}", host=name, model=model,
                 what="loads" if load else "unloads")  # fmt: skip
        return {"host": name, "model": model, "state": state}

    async def reload(self, config: Config) -> dict[str, Any]:
        """Read the config file again; a bad one is refused (ReloadRefused) and changes
        nothing. `config` is the one in force when the reload began (its path)."""
        try:
            notes = await self._reload()
        except ConfigError as e:
            raise ReloadRefused(e.errors) from None
        return {"reloaded": True, "path": config.path, "notes": notes}

    def _known_route(self, config: Config, route: str) -> None:
        """404 unless the config serves `route` or it still holds leases or a pin."""
        table = self._table
        if config.route(route) is None and not table.snapshot(route) and not table.pinned(route):
            raise not_found(f"no route or template serves {route!r}, and it holds no leases")
