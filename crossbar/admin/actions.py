"""The admin API's operator actions: release, pin, unpin, drain, reload (SPEC §10). Each is
made durable before it is acknowledged, and refused (503) while the store cannot be written."""

from __future__ import annotations

from typing import Any

from twisted.logger import Logger

from crossbar.admin.http import AdminBase, api, app, body_of
from crossbar.config.values import ConfigError
from crossbar.hosts.registry import NoSuchHost
from crossbar.wire.errors import ClientError, bad_request, not_found

log = Logger(namespace="crossbar.admin")


class ReloadRefused(Exception):
    """The config file is bad; `errors` are its problems, dotted paths first."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


class AdminActions(AdminBase):
    """The handlers that change what crossbar does."""

    @app.route("/api/routes/<route>/leases", methods=["DELETE"])
    @api
    async def release(self, request: Any, route: str) -> dict[str, Any]:
        """DELETE /api/routes/<route>/leases: drop the route's leases."""
        self._known_route(route)
        released = await self._table.release(route, self.now())
        log.info("admin: released {n} leases of route {route}", n=released, route=route)
        return {"route": route, "released": released}

    @app.route("/api/routes/<route>/pin", methods=["PUT"])
    @api
    async def pin(self, request: Any, route: str) -> dict[str, Any]:
        """PUT /api/routes/<route>/pin {"host": h}: pin to one of the route's hosts."""
        host = body_of(request).get("host")
        if not isinstance(host, str) or not host:
            raise bad_request('give the host to pin to as {"host": "<name>"}')
        resolved = self.config.route(route)
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
        await self._table.pin(route, host, self.now())
        log.info("admin: route {route} pinned to {host}", route=route, host=host)
        return {"route": route, "pinned": host, "healthy": self._hosts.healthy(host)}

    @app.route("/api/routes/<route>/pin", methods=["DELETE"])
    @api
    async def unpin(self, request: Any, route: str) -> dict[str, Any]:
        """DELETE /api/routes/<route>/pin: remove the pin; the leases stay."""
        self._known_route(route)
        table = self._table
        previous = table.pinned(route)
        await table.unpin(route, self.now())
        if previous is not None:
            log.info("admin: route {route} unpinned from {host}", route=route, host=previous)
        return {"route": route, "unpinned": previous}

    def _known_route(self, route: str) -> None:
        """404 unless the config serves `route` or it still holds leases or a pin."""
        table = self._table
        if (
            self.config.route(route) is None
            and not table.snapshot(route)
            and not table.pinned(route)
        ):
            raise not_found(f"no route or template serves {route!r}, and it holds no leases")

    # -- hosts

    @app.route("/api/hosts/<name>/drain", methods=["POST", "DELETE"])
    @api
    async def drain(self, request: Any, name: str) -> dict[str, Any]:
        """POST (drain) or DELETE (undrain) /api/hosts/<name>/drain."""
        hosts = self._hosts
        try:
            if request.method == b"POST":
                await hosts.drain(name)
            else:
                await hosts.undrain(name)
        except NoSuchHost:
            raise not_found(f"no host named {name!r} in the config") from None
        return {"host": name, "draining": hosts.draining(name)}

    @app.route("/api/hosts/<name>/evacuate", methods=["POST"])
    @api
    async def evacuate(self, request: Any, name: str) -> dict[str, Any]:
        """POST /api/hosts/<name>/evacuate: drain the host and move its conversations away,
        each prewarmed on its new host; the answer (and GET /api/hosts) shows the progress."""
        if self._evacuator is None:
            raise not_found("this crossbar cannot evacuate hosts")
        try:
            evacuation = await self._evacuator.start(name)
        except NoSuchHost:
            raise not_found(f"no host named {name!r} in the config") from None
        log.info("admin: evacuating {host}", host=name)
        return {"host": name, "draining": True, "evacuation": evacuation.view()}

    @app.route("/api/reload", methods=["POST"])
    @api
    async def reload(self, request: Any) -> dict[str, Any]:
        """POST /api/reload: read the config file again; a bad one is refused (400)."""
        try:
            notes = await self._reload()
        except ConfigError as e:
            raise ReloadRefused(e.errors) from None
        return {"reloaded": True, "path": self.config.path, "notes": notes}
