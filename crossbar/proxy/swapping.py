"""A router-mode host's answers that say a model is moving, not that the request failed
(docs/reference.md, "The request path": router mode).

While a router-mode llama-server loads or unloads a model, a request that meets it may be
answered before any byte of a reply (llama.cpp tools/server/server-models.cpp):

- 500 `proxy error: ...` (plain text): the model's child server was stopping, or not listening
  yet, when the router passed the request on;
- 500 `model limit reached, try again later`: a load found every place busy;
- 400 `model name=M is not running`: the model was unloaded between the router's wait for it
  and its passing the request on;
- 400 `request cancelled by a stop while the model was loading`;
- 503 `Loading model`: the child answered before it was ready.

None of them says anything of the request: the host is busy with that model. The proxy waits
for the move (`pause`, growing) and sends the request again, for at most `patience` seconds
(twice the model's load time, at least MIN_PATIENCE); only then does the client get a 503 of
crossbar's own, never the router's answer. Any other answer is relayed as it came.
"""

from __future__ import annotations

import json
from typing import Any

from attrs import define
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import Logger

from crossbar.limiter import Release
from crossbar.wire import Exchange, ReadAnswer, read_body, unavailable

log = Logger(namespace="crossbar.proxy")

STATUSES = frozenset({400, 500, 503})  # the statuses such an answer comes with
MIN_PATIENCE = 10.0  # seconds a turn waits for a model's move at least
_FIRST_PAUSE = 0.25
_LONGEST_PAUSE = 2.0
_MOVING = (
    "proxy error",
    "model limit reached",
    "is not running",
    "cancelled by a stop while the model was loading",
    "loading model",
)


def moving(status: int, body: bytes) -> bool:
    """Whether a router-mode host's answer `status`, `body` says the model is moving."""
    if status not in STATUSES:
        return False
    text = body[:1000].decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except ValueError:
        message = text
    else:
        error = data.get("error") if isinstance(data, dict) else None
        found = error.get("message") if isinstance(error, dict) else error
        message = found if isinstance(found, str) else ""
    message = message.strip().lower()
    return any(message.startswith(m) or m in message for m in _MOVING)


def pause(tries: int) -> float:
    """Seconds to wait before the `tries`-th try again (1, 2, ...): growing, bounded."""
    return min(_LONGEST_PAUSE, _FIRST_PAUSE * 2 ** (tries - 1))


def patience(load: float) -> float:
    """Seconds a turn waits out a model's move in all, its load taking `load` seconds."""
    return max(MIN_PATIENCE, 2 * load)


async def read_moving(response: Any, release: Release) -> ReadAnswer | None:
    """A router-mode host's error answer before any byte, read whole (its slot given back):
    None when it says the model is moving, else the answer, to be relayed as it came."""
    try:
        body = await read_body(response)
    finally:
        release()
    return None if moving(response.code, body) else ReadAnswer(response, body)


@define
class Moves:
    """One request's waits for a model moving on its host: each `wait` pauses a little longer,
    until `patience` has passed since the first."""

    clock: IReactorTime
    tries: int = 0
    since: float | None = None

    async def wait(self, ex: Exchange, host: str, model: str, load: float) -> None:
        """Wait before trying again (`load`: the model's load time there); raises crossbar's
        own 503 once the model has kept moving past the request's patience."""
        self.tries += 1
        now = self.clock.seconds()
        self.since = now if self.since is None else self.since
        if now - self.since >= patience(load):
            ex.error = f"host {host}: model {model} kept moving"
            raise unavailable(
                f"host {host} is loading or unloading model {model}; try again shortly",
                retry_after=max(1, round(load)),
            )
        log.info("host {host} is moving model {model}: trying again in {pause:g}s",
                 host=host, model=model, pause=pause(self.tries))  # fmt: skip
        await deferLater(self.clock, pause(self.tries))
