"""Health of one llama-server: the threshold state machine, probes, /props discovery.

HTTP goes through a `Getter`: `get(url, headers) -> Deferred[(status, body)]` that honours
cancellation. Production uses `treq_getter` on a persistent pool; unit tests pass a fake that
answers (or hangs) on a `Clock`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from attrs import define, frozen
from treq.client import HTTPClient
from twisted.internet import error as net
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.defer import TimeoutError as DeferredTimeout
from twisted.internet.interfaces import IReactorTime
from twisted.web.client import Agent, HTTPConnectionPool, ResponseFailed, ResponseNeverReceived
from twisted.web.iweb import IAgentEndpointFactory, IBodyProducer
from zope.interface import implementer

from crossbar.config import HostConfig, ModelConfig
from crossbar.wire import MAX_SLOTS, HostEndpoints, authorization, count, positive, quiet_pool

Getter = Callable[[str, Mapping[str, str]], "Deferred[tuple[int, bytes]]"]
# `post(url, headers, body) -> Deferred[(status, body)]`: a router's /models/load and /unload.
Poster = Callable[[str, Mapping[str, str], bytes], "Deferred[tuple[int, bytes]]"]

# A probe's own deadline (health_timeout) cancels it sooner; this only bounds a connect.
_CONNECT_TIMEOUT = 30.0
# Longest piece of an upstream error message kept in a reason (reasons go to logs and the API).
_REASON_CHARS = 120


class ProbeTimeout(Exception):
    """A probe got no complete answer within health_timeout."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"no answer within {timeout:g}s")
        self.timeout = timeout


@frozen
class Props:
    """What discovery takes from `/props`; None where the answer lacks it."""

    total_slots: int | None
    n_ctx: int | None


def build_client(
    reactor: IReactorTime, endpoints: IAgentEndpointFactory | None = None
) -> tuple[HTTPClient, HTTPConnectionPool]:
    """A treq client on its own persistent pool; the caller closes the pool when done.
    `endpoints` replaces TCP to the hosts (an in-memory network)."""
    pool = quiet_pool(reactor, persistent=True)  # no "Starting factory" line per probe
    # One probe and one /props read per host at a time: two idle connections are plenty.
    pool.maxPersistentPerHost = 2
    # Endpoints made once per host: building one per request (IDNA-encoding the name) was most
    # of a probe's cost, and 200 hosts at 1 s are 200 probes a second.
    endpoints = endpoints or HostEndpoints(reactor, _CONNECT_TIMEOUT)
    agent = Agent.usingEndpointFactory(reactor, endpoints, pool=pool)
    return HTTPClient(agent), pool  # type: ignore[arg-type]


def treq_getter(client: HTTPClient) -> Getter:
    """A Getter on `client`: the whole body is read; cancelling aborts the request."""

    async def get(url: str, headers: Mapping[str, str]) -> tuple[int, bytes]:
        # No redirects: a health endpoint that redirects is not answering 200.
        response = await client.get(url, headers=dict(headers), allow_redirects=False)
        body = await response.content()
        return response.code, body

    def start(url: str, headers: Mapping[str, str]) -> Deferred[tuple[int, bytes]]:
        return Deferred.fromCoroutine(get(url, headers))

    return start


@implementer(IBodyProducer)
class _Whole:
    """A small request body written at once (treq's own producer for bytes writes it from the
    global cooperator, a step later, on the global reactor)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.length = len(data)

    def startProducing(self, consumer: Any) -> Deferred[None]:
        consumer.write(self._data)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


def treq_poster(client: HTTPClient) -> Poster:
    """A Poster on `client`: a JSON body sent, the whole answer read."""

    async def post(url: str, headers: Mapping[str, str], body: bytes) -> tuple[int, bytes]:
        sent = {**headers, "Content-Type": "application/json"}
        data = _Whole(body)
        response = await client.post(url, data=data, headers=sent, allow_redirects=False)
        return response.code, await response.content()

    def start(url: str, headers: Mapping[str, str], body: bytes) -> Deferred[tuple[int, bytes]]:
        return Deferred.fromCoroutine(post(url, headers, body))

    return start


@frozen
class Probe:
    """One probe's outcome; `at` is clock seconds."""

    at: float
    ok: bool
    reason: str


@define
class Health:
    """One host's health: starts healthy; `unhealthy_after` bad probes in a row flip it,
    `healthy_after` good ones flip it back, a passive failure flips it at once."""

    healthy: bool = True
    reason: str = "start"  # why the host is in its current state
    good: int = 0  # consecutive good probes
    bad: int = 0  # consecutive bad probes
    flips: int = 0
    last: Probe | None = None
    proven: bool = False  # a probe has been good since the host came into the config
    # Bumped by passive failures (and by Hosts on URL changes): results of probes started
    # before are void, so a probe already under way cannot undo a failure the proxy just saw.
    epoch: int = 0

    @property
    def unproven(self) -> bool:
        """Probed, and never good yet: a host that was down when crossbar started (or when a
        reload added it) is not given new leases on the strength of starting healthy."""
        return self.last is not None and not self.proven

    def record(self, probe: Probe, unhealthy_after: int, healthy_after: int) -> bool:
        """Count one probe; True when it flipped the state (then `reason` says why)."""
        self.last = probe
        self.proven = self.proven or probe.ok
        if probe.ok:
            self.good, self.bad = self.good + 1, 0
            if not self.healthy and self.good >= healthy_after:
                return self._flip(True, f"{self.good} good probes")
        else:
            self.good, self.bad = 0, self.bad + 1
            if self.healthy and self.bad >= unhealthy_after:
                return self._flip(False, f"{self.bad} failed probes, last: {probe.reason}")
        return False

    def fail(self, reason: str, unhealthy_after: int) -> bool:
        """A passive failure: unhealthy now; True when it flipped the state."""
        self.epoch += 1
        self.good = 0
        self.bad = max(self.bad, unhealthy_after)
        return self.healthy and self._flip(False, f"request failed: {reason}")

    def _flip(self, healthy: bool, reason: str) -> bool:
        self.healthy = healthy
        self.reason = reason
        self.flips += 1
        return True


@frozen
class Prober:
    """GETs against one host's llama-server, each within `within` seconds on `clock`."""

    get: Getter
    clock: IReactorTime
    within: float

    def fetch(self, host: HostConfig, path: str) -> Deferred[tuple[int, bytes]]:
        """GET `path` of the host, with its api key as Bearer when it has one. On timeout the
        request is cancelled and fails with ProbeTimeout, whatever the cancel itself raised
        (treq wraps it in ResponseNeverReceived and friends)."""
        headers = authorization(host)

        def timed_out(result: Any, timeout: float) -> Any:
            raise ProbeTimeout(timeout)

        d = self.get(host.url + path, headers)
        return d.addTimeout(self.within, self.clock, onTimeoutCancel=timed_out)

    async def check(self, host: HostConfig) -> Probe:
        """Probe `/health`: 200 is good, anything else bad. Only cancellation raises."""
        try:
            status, body = await self.fetch(host, "/health")
        except CancelledError:
            raise
        except Exception as e:
            return Probe(self.clock.seconds(), False, failure_reason(e))
        if status == 200:
            return Probe(self.clock.seconds(), True, "status 200")
        return Probe(self.clock.seconds(), False, _redact(status_reason(status, body), host))

    async def read_props(
        self, host: HostConfig, models: Sequence[ModelConfig]
    ) -> tuple[dict[str, Props], dict[str, str]]:
        """Read `/props` for each of `models` (those whose `parallel` or `ctx` the config
        leaves unset). A host with several models is a router-mode llama-server: each is
        asked for with `?model=`, and a discovering host's with `&autoload=false` too (reading
        the settings of a model must never load it).

        Returns what was found and why the others failed, both by model name.
        """
        found: dict[str, Props] = {}
        failed: dict[str, str] = {}
        for m in models:
            query = ""
            if host.discover or len(host.models) > 1:
                query = "?model=" + quote(m.upstream_name, safe="")
                query += "&autoload=false" if host.discover else ""
            try:
                status, body = await self.fetch(host, "/props" + query)
            except CancelledError:
                raise
            except Exception as e:
                failed[m.name] = failure_reason(e)
                continue
            try:
                if status != 200:
                    raise ValueError(_redact(status_reason(status, body), host))
                found[m.name] = parse_props(body)
            except ValueError as e:
                failed[m.name] = str(e)
        return found, failed

    async def router_places(self, host: HostConfig) -> int | None:
        """The router's own `/props` `max_instances`: how many models it runs at once (0: no
        limit); None when it does not say (not a router, or an older one). Raises as
        `list_models` does."""
        status, body = await self.fetch(host, "/props")
        if status != 200:
            raise ValueError(_redact(status_reason(status, body), host))
        try:
            data = json.loads(body)
        except ValueError:
            raise ValueError("/props is not JSON") from None
        places = data.get("max_instances") if isinstance(data, dict) else None
        return count(places, MAX_SLOTS)

    async def list_models(
        self, host: HostConfig, refused: list[str] | None = None
    ) -> dict[str, str]:
        """What a host's `GET /models` lists: model id -> state (a router-mode llama-server
        says `loaded`, `unloaded`, `loading`, `sleeping`, `downloading`, or `failed` for an
        unloaded one that failed to load; a single-model server lists its model without one:
        `loaded`); ids `model_id_fault` refuses go to `refused`. Raises ValueError (or the
        request's error) saying why it could not."""
        status, body = await self.fetch(host, "/models")
        if status != 200:
            raise ValueError(_redact(status_reason(status, body), host))
        return parse_models(body, refused)


def failure_reason(error: BaseException) -> str:
    """A short, secret-free reason for a failed request: refused, timeout, reset, ..."""
    if isinstance(error, ProbeTimeout):
        return f"timeout ({error})"
    if isinstance(error, DeferredTimeout):
        return "timeout"
    if isinstance(error, net.ConnectionRefusedError):
        return "refused"
    if isinstance(error, net.TCPTimedOutError | net.TimeoutError):
        return "connect timeout"
    if isinstance(error, net.DNSLookupError):
        return "DNS lookup failed"
    if isinstance(error, ResponseNeverReceived):
        return "reset (connection closed before a response)"
    if isinstance(error, ResponseFailed | net.ConnectionLost | net.ConnectionDone):
        return "reset (connection lost)"
    if isinstance(error, net.ConnectError):
        return f"connect failed: {error.__class__.__name__}"
    return f"error: {error.__class__.__name__}: {_clip(str(error))}"


def status_reason(status: int, body: bytes) -> str:
    """`status 503: Loading model` from llama-server's error body, or just `status 404`."""
    message = _error_message(body)
    return f"status {status}: {message}" if message else f"status {status}"


def parse_props(body: bytes) -> Props:
    """Read `total_slots` and `default_generation_settings.n_ctx` from a /props answer.

    Raises ValueError when the body is not a JSON object.
    """
    try:
        data = json.loads(body)
    except ValueError:
        raise ValueError("/props is not JSON") from None
    if not isinstance(data, dict):
        raise ValueError("/props is not a JSON object")
    settings = data.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    # A count past wire/reported.py's bounds is no count at all: the config's, else unknown.
    return Props(total_slots=positive(data.get("total_slots"), MAX_SLOTS), n_ctx=positive(n_ctx))


# The longest model id a listing may name: ids are file or repository names, never this long.
MAX_MODEL_ID = 512


def model_id_fault(name: str) -> str:
    """Why a model id a host lists cannot be a model's ("" when it can): a control or
    separator character (a model name never needs one, and one would forge log lines and
    break /metrics), or a length past MAX_MODEL_ID."""
    if len(name) > MAX_MODEL_ID:
        return f"longer than {MAX_MODEL_ID} characters"
    if not name.isprintable():
        return "it holds control characters"
    return ""


def parse_models(body: bytes, refused: list[str] | None = None) -> dict[str, str]:
    """Model id -> state from a `GET /models` answer (see `Prober.list_models`); an id
    `model_id_fault` refuses is left out (and added to `refused`, when given)."""
    try:
        data = json.loads(body)
    except ValueError:
        raise ValueError("/models is not JSON") from None
    listed = data.get("data") if isinstance(data, dict) else None
    if not isinstance(listed, list):
        raise ValueError('/models has no "data" list')
    models: dict[str, str] = {}
    for entry in listed:
        name = entry.get("id") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            continue
        if model_id_fault(name):
            if refused is not None:
                refused.append(name)
            continue
        status = entry.get("status")
        state = status.get("value") if isinstance(status, dict) else None
        if isinstance(status, dict) and status.get("failed"):
            state = "failed"
        models[name] = state if isinstance(state, str) and state else "loaded"
    return models


def _error_message(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return _clip(err["message"])
        if isinstance(err, str):
            return _clip(err)
    return _clip(text.splitlines()[0]) if text else ""


def _redact(text: str, host: HostConfig) -> str:
    # An upstream error page might echo the key we sent; reasons go to logs and the API.
    return text.replace(host.api_key, "***") if host.api_key else text


def _clip(text: str) -> str:
    text = "".join(c if c.isprintable() else " " for c in text).strip()
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."
