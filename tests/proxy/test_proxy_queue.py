"""One slot, a queue behind it, and clients that leave: the slot is never lost. Told on the
in-memory network: each host answers when the story says, and time moves only when it says."""

import json

from tests.support.memnet import CHAT_PATH, chat, sse, start

ONE = {"convo": {"hosts": ["titan"]}}


def queued(crossbar) -> int:
    return crossbar.parts.limiter.queued("titan", "qwen-coder")


def in_flight(crossbar) -> int:
    return crossbar.parts.limiter.in_flight("titan", "qwen-coder")


def test_a_second_request_waits_for_the_only_slot_and_says_how_long():
    crossbar = start(ONE, hosts=("titan",), parallel=1)
    net = crossbar.net
    first = crossbar.post(CHAT_PATH, chat("one"))
    second = crossbar.post(CHAT_PATH, chat("two"))
    (host,) = net.connections["titan"]
    assert host.requests() == 1 and queued(crossbar) == 1  # the second waits in crossbar
    net.clock.advance(0.25)
    host.answer()
    net.flush()
    assert first.status == 200 and first.header(b"X-Crossbar-Queue-Ms") == b"0"
    # The slot went to the waiter at once, on a connection of its own: the one that just
    # answered rests before it carries another request.
    (_, fresh) = net.connections["titan"]
    assert fresh.requests() == 1 and in_flight(crossbar) == 1
    fresh.answer()
    net.flush()
    assert second.status == 200 and second.header(b"X-Crossbar-Queue-Ms") == b"250"


def test_a_full_queue_answers_429_with_retry_after():
    crossbar = start(ONE, hosts=("titan",), parallel=1, queue_max=1)
    crossbar.post(CHAT_PATH, chat("one"))
    crossbar.post(CHAT_PATH, chat("two"))
    third = crossbar.post(CHAT_PATH, chat("three"))
    assert third.status == 429
    error = json.loads(third.received.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["type"] == "rate_limit_error"
    assert int(third.header(b"Retry-After")) >= 1
    assert queued(crossbar) == 1  # the refused one took no place


def test_a_client_leaving_while_queued_leaves_the_queue_at_once():
    crossbar = start(ONE, hosts=("titan",), parallel=1)
    net = crossbar.net
    first = crossbar.post(CHAT_PATH, chat("one"))
    leaving = crossbar.post(CHAT_PATH, chat("two"))
    assert queued(crossbar) == 1
    leaving.transport.loseConnection()
    net.flush()
    assert queued(crossbar) == 0  # at once, not at queue_timeout
    (host,) = net.connections["titan"]
    host.answer()
    net.flush()
    assert first.status == 200 and host.requests() == 1  # nothing was sent for the leaver
    assert in_flight(crossbar) == 0


def test_a_client_leaving_mid_stream_frees_the_slot_and_aborts_the_upstream():
    crossbar = start(ONE, hosts=("titan",), parallel=1)
    net = crossbar.net
    net.on_request["titan"] = lambda host: sse(host, 3)
    client = crossbar.post(CHAT_PATH, chat("streaming"))
    assert client.received.count(b"data: ") == 3 and in_flight(crossbar) == 1
    client.transport.loseConnection()  # the client hangs up mid-stream
    net.flush()
    (host,) = net.connections["titan"]
    assert host.lost  # the host's connection is aborted: it stops generating
    assert in_flight(crossbar) == 0
    net.on_request["titan"] = lambda host: host.answer()
    nxt = crossbar.post(CHAT_PATH, chat("next"))
    assert nxt.status == 200 and nxt.header(b"X-Crossbar-Queue-Ms") == b"0"
