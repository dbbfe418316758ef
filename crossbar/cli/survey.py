"""What a llama-server says it serves, asked as `crossbar init` asks: plain blocking HTTP (a
short-lived process, as `crossbar ctl`), each request bounded by a timeout, and every way it can
fail one `NotServing` reason for the operator.

A llama-server answers `GET /props` with a JSON object holding `default_generation_settings`
(a router's with `"role": "router"`) and `GET /v1/models` with a `data` list; anything else at
the URL is not one. Its `/props` and `/models` answers are read as crossbar reads them at run
time (hosts: `parse_props`, `parse_models`).
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection, HTTPException, HTTPSConnection
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import quote
from urllib.request import (
    HTTPHandler,
    HTTPRedirectHandler,
    HTTPSHandler,
    ProxyHandler,
    Request,
    build_opener,
)

from attrs import field, frozen

from crossbar.cli.draft import Model, Server
from crossbar.hosts import parse_models, parse_props, status_reason

_MOST = 4 * 1024 * 1024  # bytes of an answer read (a /props holds the chat template)


class NotServing(Exception):
    """Why a URL is not a llama-server crossbar can be put in front of, in one line."""


@frozen
class KeyEnv:
    """An `--api-key-env` variable: its name and its value here ("" when unset)."""

    name: str
    value: str = field(repr=False)


class _NoRedirects(HTTPRedirectHandler):
    # A llama-server never redirects; whatever does is something else, and says so by it.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Deadline:
    """One request's whole time: a socket's timeout bounds each wait for bytes, so a server
    that trickles a byte a second kept init waiting for minutes; at the deadline the
    request's socket is shut down, which ends whatever read is blocked on it."""

    def __init__(self, seconds: float) -> None:
        self.passed = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        _watching.deadline = self
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        _watching.deadline = None

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.passed:
                _shut(sock)

    def _cut(self) -> None:
        with self._lock:
            self.passed = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


_watching = threading.local()  # the deadline of the request this thread makes


def _watched(connection: Any) -> None:
    deadline = getattr(_watching, "deadline", None)
    if deadline is not None and connection.sock is not None:
        deadline.watch(connection.sock)


class _HTTP(HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _watched(self)


class _HTTPS(HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _watched(self)


class _Handlers(HTTPHandler, HTTPSHandler):
    """urllib's handlers on connections a `_Deadline` can cut."""

    def http_open(self, req: Request) -> Any:
        return self.do_open(_HTTP, req)

    def https_open(self, req: Request) -> Any:
        return self.do_open(_HTTPS, req, context=self._context)


# No proxy from the environment: crossbar connects to its hosts directly, so init asks them
# the way crossbar will.
_OPENER = build_opener(ProxyHandler({}), _NoRedirects, _Handlers)


def _get(url: str, path: str, key: str, timeout: float) -> tuple[int, bytes]:
    """(status, body) of `GET url+path`, with `key` as Bearer when given, all of it within
    `timeout` (the connect, the head and the body); NotServing when no whole HTTP answer
    came in that time."""
    headers = {"Accept": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    with _Deadline(timeout) as deadline:
        try:
            with _OPENER.open(Request(url + path, headers=headers), timeout=timeout) as response:
                status, body = response.status, response.read(_MOST)
        except HTTPError as e:
            with e:
                status, body = e.code, e.read(_MOST)
        except URLError as e:
            raise NotServing(_unreachable(e.reason, timeout, deadline.passed)) from None
        except (OSError, HTTPException) as e:
            raise NotServing(_unreachable(e, timeout, deadline.passed)) from None
    if deadline.passed:  # a body cut at the deadline reads as one that ended
        raise NotServing(f"no whole answer within {timeout:g} s")
    return status, body


def _unreachable(reason: object, timeout: float, passed: bool = False) -> str:
    if passed or isinstance(reason, TimeoutError | socket.timeout):
        return f"no whole answer within {timeout:g} s"  # silent, or too slow: one story
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused: no server listens there"
    if isinstance(reason, socket.gaierror):
        return f"unknown host name ({reason.strerror})"
    if isinstance(reason, ssl.SSLError):
        return f"TLS failed: {reason.reason or reason}"
    if isinstance(reason, OSError) and reason.strerror:
        return f"cannot connect: {reason.strerror}"
    if isinstance(reason, HTTPException):
        return f"not an HTTP answer ({reason.__class__.__name__})"
    return f"cannot connect: {reason}"


def _html(body: bytes) -> bool:
    return body.lstrip()[:15].lower().startswith((b"<!doctype", b"<html"))


def _refusal(path: str, status: int, body: bytes) -> NotServing:
    """Why an answer other than 200 means the URL is not a llama-server init can read."""
    said = f"status {status} with an HTML page" if _html(body) else status_reason(status, body)
    if status == 503:
        return NotServing(
            f"GET {path} answered {said}: still loading its model? run init again once "
            "its /health answers 200"
        )
    if status in (404, 405, 501) or 300 <= status < 400:  # a llama-server never redirects
        return NotServing(f"not a llama-server: GET {path} answered {said}")
    return NotServing(f"GET {path} answered {said}")


def _json_object(path: str, body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        said = "an HTML page" if _html(body) else "something that is not JSON"
        raise NotServing(f"not a llama-server: GET {path} answered {said}") from None
    if not isinstance(data, dict):
        raise NotServing(f"not a llama-server: GET {path} is not a JSON object")
    return data


def _key_for(url: str, keys: Sequence[KeyEnv], timeout: float) -> KeyEnv:
    """The `--api-key-env` variable whose key the server takes; NotServing saying what to
    do when none does."""
    if not keys:
        raise NotServing(
            "wants an API key (401 on GET /props): pass --api-key-env NAME, NAME an "
            "environment variable holding the key (init writes the variable's name, never "
            "the key)"
        )
    for key in keys:
        if key.value and _get(url, "/props", key.value, timeout)[0] != 401:
            return key
    tried = " or ".join(f"${k.name}" for k in keys if k.value)
    unset = " or ".join(f"${k.name}" for k in keys if not k.value)
    if not tried:
        raise NotServing(
            f"wants an API key (401 on GET /props), and {unset} is not set here: set it to "
            "the server's key and run init again"
        )
    also = f"; {unset} is not set here" if unset else ""
    raise NotServing(f"wants an API key and refused the one in {tried} (401){also}")


def _slots(url: str, key: str, timeout: float) -> tuple[int | None, int | None]:
    """Slots and tokens per slot from `/slots`, for a `/props` without them; (None, None)
    when `/slots` is off (`--no-slots`) or says nothing."""
    status, body = _get(url, "/slots", key, timeout)
    try:
        slots = json.loads(body) if status == 200 else None
    except ValueError:
        return None, None
    if not isinstance(slots, list) or not slots:
        return None, None
    first = slots[0]
    n_ctx = first.get("n_ctx") if isinstance(first, dict) else None
    return len(slots), n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None


def survey(url: str, keys: Sequence[KeyEnv], timeout: float) -> Server:
    """Ask the llama-server at `url` what it serves; NotServing saying why it cannot be."""
    status, body = _get(url, "/props", "", timeout)
    key = KeyEnv("", "")
    if status == 401:
        key = _key_for(url, keys, timeout)
        status, body = _get(url, "/props", key.value, timeout)
    if status != 200:
        raise _refusal("/props", status, body)
    props_body, props = body, _json_object("/props", body)
    if not isinstance(props.get("default_generation_settings"), dict):
        raise NotServing("not a llama-server: its /props has no default_generation_settings")
    router = props.get("role") == "router"
    status, body = _get(url, "/v1/models", key.value, timeout)
    if status != 200:
        raise _refusal("/v1/models", status, body)
    try:
        listed = parse_models(body)
    except ValueError as e:
        raise NotServing(f"not a llama-server: {e}") from None
    if not listed:
        raise NotServing("serves no model: its GET /v1/models lists none")
    places = None
    if router:
        models = tuple(_router_model(url, name, state, key.value, timeout)
                       for name, state in listed.items())  # fmt: skip
        found_places = props.get("max_instances")
        if isinstance(found_places, int) and not isinstance(found_places, bool):
            places = max(0, found_places)
    else:
        found = parse_props(props_body)
        slots, ctx = found.total_slots, found.n_ctx
        if slots is None or ctx is None:
            more = _slots(url, key.value, timeout)
            slots, ctx = slots or more[0], ctx or more[1]
        models = tuple(Model(name, "loaded", slots, ctx) for name in listed)
    return Server(url, models, router=router, key_env=key.name, places=places)


def _router_model(url: str, name: str, state: str, key: str, timeout: float) -> Model:
    """A router's model, with its slots and context when it is loaded (asked so as never to
    load it: `autoload=false`); what cannot be read is left unknown."""
    if state != "loaded":
        return Model(name, state)
    try:
        status, body = _get(url, f"/props?model={quote(name, safe='')}&autoload=false", key,
                            timeout)  # fmt: skip
        props = parse_props(body) if status == 200 else None
    except (NotServing, ValueError):
        props = None
    if props is None:
        return Model(name, state)
    return Model(name, state, props.total_slots, props.n_ctx)


def survey_all(
    urls: Sequence[str], keys: Sequence[KeyEnv], timeout: float
) -> list[Server | NotServing]:
    """`survey` of every URL at once (one thread each, at most 16), in their order: a server
    or why it is not one. `timeout` bounds each request's whole answer."""

    def one(url: str) -> Server | NotServing:
        try:
            return survey(url, keys, timeout)
        except NotServing as e:
            return e
        except Exception as e:  # what no rule above foresaw is still one line, not a traceback
            return NotServing(f"unexpected: {e.__class__.__name__}: {e}")

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(urls)))) as pool:
        return list(pool.map(one, urls))


def key_envs(names: Sequence[str], environ: Mapping[str, str]) -> list[KeyEnv]:
    """The `--api-key-env` variables with their values in `environ`."""
    return [KeyEnv(name, environ.get(name, "")) for name in names]
