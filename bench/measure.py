"""What the benches measure with: a request body sent at once, a response read with the time of
its first byte, nearest-rank percentiles, and a process's CPU seconds."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IConsumer
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.iweb import IBodyProducer
from zope.interface import implementer

CLK_TCK = os.sysconf("SC_CLK_TCK")


@implementer(IBodyProducer)
class BytesProducer:
    """A request body written in one go (FileBodyProducer goes through a cooperator)."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.length = len(body)

    def startProducing(self, consumer: IConsumer) -> defer.Deferred[None]:
        consumer.write(self.body)
        return defer.succeed(None)

    def pauseProducing(self) -> None:
        """Nothing to pause: the body is written at once."""

    resumeProducing = stopProducing = pauseProducing


class Reader(Protocol):
    """Reads a response body, noting the reactor time of its first byte."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.first: float | None = None
        self.chunks: list[bytes] = []
        self.done: defer.Deferred[bytes] = defer.Deferred()

    def dataReceived(self, data: bytes) -> None:
        if self.first is None:
            self.first = self.clock.seconds()
        self.chunks.append(data)

    def connectionLost(self, reason: Failure) -> None:  # type: ignore[override]
        if reason.check(ResponseDone):
            self.done.callback(b"".join(self.chunks))
        else:
            self.done.errback(reason)


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank `q` percentile (0..100) of `values`; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil
    return ordered[int(rank) - 1]


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of `pid` (None: this process) so far."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK
