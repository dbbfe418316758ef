"""A client that hangs up while crossbar is still reaching its host, or just as the host's
answer arrives, is nobody's failure: the host stays healthy, nothing is resent, no 500 is
written, and no traceback reaches the log (the fleet test saw `Relay.connectionMade` fail on a
request whose channel was gone)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from twisted.logger import globalLogPublisher

from tests.support.memnet import MODEL, chat, start
from tests.support.routes import CONVO

ROUTES = CONVO
CHAT = "/r/convo/v1/chat/completions"


@pytest.fixture
def failures() -> Iterator[list[dict]]:
    """Every event logged with a failure (a traceback) while the test runs."""
    seen: list[dict] = []

    def observe(event: dict) -> None:
        if "log_failure" in event:
            seen.append(event)

    globalLogPublisher.addObserver(observe)
    yield seen
    globalLogPublisher.removeObserver(observe)


def test_a_hang_up_during_the_hosts_name_lookup_ejects_nothing_and_logs_no_traceback(failures):
    crossbar = start(ROUTES)
    net = crossbar.net
    net.stall.update({"titan", "atlas"})
    clients = [crossbar.post(CHAT, chat(f"conversation {i}")) for i in range(20)]
    for client in clients:
        client.transport.loseConnection()
    net.flush()
    assert crossbar.parts.hosts.healthy("titan") and crossbar.parts.hosts.healthy("atlas")
    assert {(row.status, row.error) for row in crossbar.store.usage} == {
        (499, "client disconnected")
    }
    assert failures == []


@pytest.mark.parametrize("hang_up_first", [True, False])
def test_a_hang_up_crossing_the_hosts_answer_is_no_500_and_no_traceback(hang_up_first, failures):
    crossbar = start(ROUTES)
    net = crossbar.net
    client = crossbar.post(CHAT, chat())
    (upstream,) = net.connections["titan"]
    if hang_up_first:
        client.transport.loseConnection()
        upstream.answer()
    else:
        upstream.answer()
        client.transport.loseConnection()
    net.flush()  # both cross in one go
    assert crossbar.parts.hosts.healthy("titan")
    assert crossbar.parts.limiter.in_flight("titan", MODEL) == 0
    (row,) = crossbar.store.usage
    assert row.status != 500 and row.host == "titan"
    assert b"500" not in client.received
    assert failures == []
