"""A router-mode host's own model API: load and unload a model (`POST /models/load`, `POST
/models/unload`, llama.cpp tools/server/server-models.cpp), for the operator (the admin API,
`crossbar ctl load`/`unload`) and for a host's `keep_loaded` models, which are loaded again
whenever a listing finds them unloaded.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from crossbar.hosts.health import Poster, failure_reason, status_reason
from crossbar.hosts.residency import FAILED, OPERATOR, RUNNING, ModelEvent
from crossbar.wire import authorization

if TYPE_CHECKING:
    from crossbar.hosts.entry import HostEntry

# /models/load answers once the child is spawned, but first waits for the LRU model it unloads
# to stop: longer than a probe.
_TIMEOUT = 30.0


class RouterRefused(Exception):
    """The router did not do what it was asked: `status` (0: no answer) and why."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class NotARouter(Exception):
    """The host is not a router-mode host (`models = "discover"`)."""


class UnknownModel(KeyError):
    """The router does not list this model."""

    def __str__(self) -> str:
        return f"the host does not list model {self.args[0]!r}"


class RouterControl:
    """Loads and unloads models through a router's API; one per registry."""

    def __init__(
        self,
        find: Callable[[str], HostEntry],
        tell: Callable[[Sequence[ModelEvent]], None],
        clock: IReactorTime,
        post: Poster | None,
        log: Logger,
    ) -> None:
        """`find(name)` is the registry's host (raising NoSuchHost); `tell` takes the loads
        and unloads this causes."""
        self._find = find
        self._tell = tell
        self._clock = clock
        self._post = post
        self._log = log
        self._keeping: set[tuple[str, str]] = set()  # keep_loaded loads under way

    async def load(self, name: str, model: str, reason: str = OPERATOR) -> str:
        """Have host `name` load `model`; its state as crossbar knows it after. Raises
        NoSuchHost, NotARouter, UnknownModel or RouterRefused."""
        host, upstream = self._target(name, model)
        status, body = await self._call(host, "/models/load", upstream)
        message = _message(body)
        residency = host.residency
        assert residency is not None
        if status != 200 and "already running" not in message:
            raise RouterRefused(status, status_reason(status, body))
        self._tell(residency.loading(model, self._clock.seconds(), reason))
        return residency.state(model) or ""

    async def unload(self, name: str, model: str, reason: str = OPERATOR) -> str:
        """Have host `name` unload `model`; its state after. Raises as `load`."""
        host, upstream = self._target(name, model)
        status, body = await self._call(host, "/models/unload", upstream)
        residency = host.residency
        assert residency is not None
        if status != 200 and "not running" not in _message(body):
            raise RouterRefused(status, status_reason(status, body))
        self._tell(residency.unloading(model, self._clock.seconds(), reason))
        return residency.state(model) or ""

    def keep(self, name: str, host: HostEntry, reason: str) -> None:
        """Load the host's `keep_loaded` models that its listing found not running (not those
        that failed to load: the operator's to look at), one load of each at a time."""
        residency = host.residency
        if residency is None or self._post is None:
            return
        for model in host.config.keep_loaded:
            state = residency.state(model)
            if state is None or state in RUNNING or state == FAILED:
                continue
            if (name, model) in self._keeping:
                continue
            self._keeping.add((name, model))
            d = Deferred.fromCoroutine(self.load(name, model, reason))
            d.addErrback(self._keep_failed, name, model)
            d.addBoth(lambda _, pair=(name, model): self._keeping.discard(pair))

    def _keep_failed(self, failure: Any, name: str, model: str) -> None:
        why = failure.value
        reason = why.reason if isinstance(why, RouterRefused) else str(why)
        self._log.warn(
            "host {host}: cannot load kept model {model}: {why}", host=name, model=model, why=reason
        )

    def _target(self, name: str, model: str) -> tuple[HostEntry, str]:
        host = self._find(name)
        if host.residency is None:
            raise NotARouter(name)
        found = host.catalog.model(model)
        if found is None:
            raise UnknownModel(model)
        return host, found.upstream_name

    async def _call(self, host: HostEntry, path: str, model: str) -> tuple[int, bytes]:
        if self._post is None:
            raise RouterRefused(0, "no HTTP client to reach the host with")
        body = json.dumps({"model": model}).encode()
        d = self._post(host.config.url + path, authorization(host.config), body)
        d.addTimeout(_TIMEOUT, self._clock)
        try:
            return await d
        except CancelledError:
            raise RouterRefused(0, f"no answer within {_TIMEOUT:g}s") from None
        except Exception as e:
            raise RouterRefused(0, failure_reason(e)) from None


def _message(body: bytes) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace")
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    return message if isinstance(message, str) else ""
