"""The few private Twisted APIs crossbar relies on, each where no public one serves.

Each use has a test in tests/wire/test_twisted_private.py, and pyproject.toml bounds Twisted
from above, so an upgrade that moves one of these fails a named test instead of a request.

- A TCP transport's write buffer (`dataBuffer`, `offset`, `_tempDataBuffer`) and `socket`:
  `write_now` sends at once, with one `sendmsg`, what would otherwise wait for the next
  reactor turn to find the socket writable (an epoll event and two epoll_ctl calls per
  write, a tenth of the proxy's CPU), when nothing written before is still waiting; and
  `unsent` tells whether a request's bytes still wait there (TLS's `_appSendBuffer` too), so
  a connection whose host answered before reading them is never given another request.
- The connection pool's `_factory`: the only way to make the factories of the health probes'
  treq pool quiet (one "Starting factory" log line per probe connection is noise).
- `_PullToPush`: how twisted.web's HTTPChannel serves a pull producer (an IPullProducer
  registered with `streaming=False`, as twisted.web.static's file producers are) from a push
  consumer; crossbar's own channel (proxy/channel.py) does as it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.internet import tcp
from twisted.internet._producer_helpers import _PullToPush
from twisted.web.client import HTTPConnectionPool, _HTTP11ClientFactory

__all__ = ["pull_to_push", "quiet_pool", "unsent", "write_now"]

_PLAIN = (tcp.Server, tcp.Client)


def write_now(transport: Any, pieces: Sequence[bytes]) -> None:
    """Write `pieces` (in order) to `transport`: on a plain TCP connection with nothing
    waiting to be sent, straight to its socket, the rest (if the socket took only part)
    through the transport's buffer as any write; on any other transport, as any write."""
    if (
        type(transport) in _PLAIN
        and not transport.TLS
        and transport.connected
        and not transport.disconnecting
        and not transport.dataBuffer
        and not transport._tempDataBuffer
    ):
        try:
            sent = transport.socket.sendmsg(pieces)
        except OSError:
            sent = 0  # EAGAIN, or a socket in trouble: the transport's write finds out which
        if sent:
            for i, piece in enumerate(pieces):
                if sent < len(piece):
                    pieces = [piece[sent:], *pieces[i + 1 :]]
                    break
                sent -= len(piece)
            else:
                return
    transport.writeSequence(pieces)


def unsent(transport: Any) -> bool:
    """Whether bytes written to `transport` still wait in this process to be sent (on a plain
    TCP connection, or TLS over one); False for any other transport (a test's, in memory)."""
    while transport is not None:
        if type(transport) in _PLAIN:
            return len(transport.dataBuffer) > transport.offset or bool(transport._tempDataBuffer)
        if getattr(transport, "_appSendBuffer", None):  # TLS: written before its handshake
            return True
        transport = getattr(transport, "transport", None)  # TLS over TCP: the TCP under it
    return False


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
