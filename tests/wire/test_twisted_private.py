"""Each private Twisted API crossbar uses (crossbar/wire/twisted_private.py) still works as
relied on: an upgrade that moves one fails here, by name, instead of in a request."""

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock, deferLater
from twisted.internet.testing import StringTransport
from twisted.web.client import HTTPConnectionPool

from crossbar.wire.twisted_private import pull_to_push, quiet_pool


def test_the_quiet_pools_factories_log_nothing():
    pool = quiet_pool(Clock(), persistent=True)
    assert isinstance(pool, HTTPConnectionPool) and pool.persistent
    factory = pool._factory(lambda protocol: None, "test")
    assert factory.noisy is False
    assert factory.buildProtocol(None) is not None


class _Pull:
    """A pull producer of three pieces, as twisted.web.static's are."""

    def __init__(self, consumer):
        self.consumer = consumer
        self.pieces = [b"one", b"two", b"three"]
        self.stopped = False

    def resumeProducing(self):
        if self.pieces:
            self.consumer.write(self.pieces.pop(0))

    def stopProducing(self):
        self.stopped = True


@pytest_twisted.ensureDeferred
async def test_a_pull_producer_is_driven_into_a_push_consumer_until_stopped():
    transport = StringTransport()
    producer = _Pull(transport)
    pushed = pull_to_push(producer, transport)  # the global cooperator drives it
    try:
        for _ in range(100):
            if not producer.pieces:
                break
            await deferLater(reactor, 0, lambda: None)
        assert transport.value() == b"onetwothree"
    finally:
        pushed.stopStreaming()
