"""The few private Twisted APIs crossbar relies on, each where no public one serves.

Each use has a test in tests/wire/test_twisted_private.py, and pyproject.toml bounds Twisted
from above, so an upgrade that moves one of these fails a named test instead of a request.

- The connection pool's `_factory`: the only way to make the factories of the health probes'
  treq pool quiet (one "Starting factory" log line per probe connection is noise).
- `_PullToPush`: how twisted.web's HTTPChannel serves a pull producer (an IPullProducer
  registered with `streaming=False`, as twisted.web.static's file producers are) from a push
  consumer; crossbar's own channel (proxy/channel.py) does as it does.
"""

from __future__ import annotations

from typing import Any

from twisted.internet._producer_helpers import _PullToPush
from twisted.web.client import HTTPConnectionPool, _HTTP11ClientFactory

__all__ = ["pull_to_push", "quiet_pool"]


class _QuietFactory(_HTTP11ClientFactory):
    noisy = False


def quiet_pool(reactor: Any, persistent: bool) -> HTTPConnectionPool:
    """An HTTPConnectionPool whose factories log nothing."""
    pool = HTTPConnectionPool(reactor, persistent=persistent)
    pool._factory = _QuietFactory
    return pool


def pull_to_push(producer: Any, consumer: Any) -> Any:
    """A push producer driving the pull `producer` into `consumer`, already streaming; its
    `stopStreaming` stops it."""
    pushed = _PullToPush(producer, consumer)
    pushed.startStreaming()
    return pushed
