"""Each fault switch of the fake does what it says, and turning it off heals the fake."""

import json
import socket

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ConnectionDone, ConnectionLost, ConnectionRefusedError
from twisted.internet.protocol import Protocol
from twisted.internet.task import Clock
from twisted.internet.threads import deferToThread
from twisted.test.iosim import FakeTransport, connect
from twisted.web.client import ResponseDone, ResponseNeverReceived

from crossbar.testing.fakellama import FakeLlama
from tests.support.fakehelp import client, events, get, post, until, user, wait


@pytest_twisted.async_yield_fixture
async def fake():
    fake = FakeLlama(reactor, parallel=2)
    await fake.start()
    yield fake
    await fake.stop()


class Body(Protocol):
    """Collects a streamed body; `events` fires once `n` SSE events have arrived."""

    def __init__(self, n=None):
        self.data = b""
        self.reason = None
        self.done = Deferred()
        self.events = Deferred()
        self._n = n

    def dataReceived(self, data):
        self.data += data
        if self._n is not None and self.data.count(b"data: ") >= self._n:
            if not self.events.called:
                self.events.callback(None)

    def connectionLost(self, reason):
        self.reason = reason
        self.done.callback(None)


async def open_stream(fake, n=None, **extra):
    body = {"messages": user("stream"), "stream": True, **extra}
    response = await wait(client().post(fake.url + "/v1/chat/completions", json=body))
    collector = Body(n)
    response.deliverBody(collector)
    return collector


@pytest_twisted.ensureDeferred
async def test_refuse_closes_the_port_and_off_listens_again_on_the_same_port(fake):
    port, url = fake.port, fake.url
    stream = await open_stream(fake, tokens_per_second=50, max_tokens=500)
    fake.faults.refuse = True
    await wait(fake.settle())
    with pytest.raises(ConnectionRefusedError):
        await get(fake, "/health")
    # A dead host takes its open connections with it: the stream is cut, not finished.
    await wait(stream.done)
    assert stream.reason.check(ResponseDone) is None
    await until(lambda: fake.counters.in_flight == 0)
    assert (fake.counters.dropped, fake.counters.aborted) == (1, 0)
    fake.faults.refuse = False
    await wait(fake.settle())
    response, _ = await get(fake, "/health")
    assert response.code == 200 and (fake.port, fake.url) == (port, url)


@pytest_twisted.ensureDeferred
async def test_refuse_set_over_http_answers_first_and_refuse_for_heals_by_itself(fake):
    response, faults = await post(fake, "/_fake/faults", {"refuse": True, "refuse_for": 0.2})
    assert response.code == 200 and faults["refuse"] is True
    await wait(fake.settle())
    with pytest.raises(ConnectionRefusedError):
        await get(fake, "/health")
    await until(lambda: not fake.faults.refuse)
    await wait(fake.settle())
    response, _ = await get(fake, "/health")
    assert response.code == 200


@pytest_twisted.ensureDeferred
async def test_error_500_fails_inference_but_not_health(fake):
    fake.faults.error_500 = True
    response, body = await post(fake, "/v1/chat/completions", {"messages": user("x")})
    assert response.code == 500
    assert body["error"]["code"] == 500 and body["error"]["type"] == "server_error"
    assert (await get(fake, "/health"))[0].code == 200
    fake.faults.error_500 = False
    assert (await post(fake, "/v1/chat/completions", {"messages": user("x")}))[0].code == 200


@pytest_twisted.ensureDeferred
async def test_hang_accepts_inference_and_never_answers_until_the_client_leaves(fake):
    fake.faults.hang = True
    pending = client().post(fake.url + "/v1/chat/completions", json={"messages": user("x")})
    outcome = []
    pending.addBoth(outcome.append)
    await until(lambda: fake.counters.in_flight == 1)
    assert (await get(fake, "/health"))[0].code == 200  # the server itself still answers
    assert outcome == []
    pending.cancel()  # the client gives up
    assert outcome[0].check(ResponseNeverReceived, CancelledError)
    await until(lambda: fake.counters.aborted == 1)
    assert fake.counters.in_flight == 0 and fake.counters.completions == []
    fake.faults.hang = False
    assert (await post(fake, "/v1/chat/completions", {"messages": user("x")}))[0].code == 200


@pytest_twisted.ensureDeferred
async def test_drop_after_chunks_cuts_the_stream_after_n_events(fake):
    fake.faults.drop_after_chunks = 3
    stream = await open_stream(fake, max_tokens=20)
    await wait(stream.done)
    assert stream.reason.check(ResponseDone) is None  # no terminating chunk: a visible cut
    assert len(events(stream.data.decode())) == 3
    await until(lambda: fake.cache.busy == 0)
    (done,) = fake.counters.completions
    assert done.outcome == "dropped" and done.completion_tokens >= 2  # role + 2 tokens went out
    assert (fake.counters.dropped, fake.counters.aborted) == (1, 0)


@pytest_twisted.ensureDeferred
async def test_drop_after_zero_chunks_cuts_before_any_response_byte(fake):
    fake.faults.drop_after_chunks = 0
    with pytest.raises(ResponseNeverReceived):
        await wait(client().post(fake.url + "/v1/chat/completions", json={"messages": user("x")}))
    fake.faults.drop_after_chunks = None
    assert (await post(fake, "/v1/chat/completions", {"messages": user("x")}))[0].code == 200


def lost(error):
    """How the connection under a failed response (ResponseFailed and kin) ended."""
    return [r.type for r in error.reasons if r.check(ConnectionDone, ConnectionLost)]


@pytest_twisted.ensureDeferred
async def test_reset_after_chunks_resets_the_stream_after_n_events(fake):
    fake.faults.reset_after_chunks = 3
    stream = await open_stream(fake, max_tokens=20)
    await wait(stream.done)
    # The 3 events arrive, then the connection is lost uncleanly: not drop's clean close.
    assert len(events(stream.data.decode())) == 3
    assert lost(stream.reason.value) == [ConnectionLost]
    await until(lambda: fake.cache.busy == 0)
    (done,) = fake.counters.completions
    assert done.outcome == "dropped"
    assert (fake.counters.dropped, fake.counters.aborted) == (1, 0)
    fake.faults.reset_after_chunks = None
    fake.faults.drop_after_chunks = 3
    stream = await open_stream(fake, max_tokens=20)
    await wait(stream.done)
    assert lost(stream.reason.value) == [ConnectionDone]


@pytest_twisted.ensureDeferred
async def test_reset_after_zero_chunks_resets_before_any_response_byte(fake):
    fake.faults.reset_after_chunks = 0
    with pytest.raises(ResponseNeverReceived) as cut:
        await wait(client().post(fake.url + "/v1/chat/completions", json={"messages": user("x")}))
    assert lost(cut.value) == [ConnectionLost]
    assert (fake.counters.dropped, fake.counters.aborted) == (1, 0)
    fake.faults.reset_after_chunks = None
    assert (await post(fake, "/v1/chat/completions", {"messages": user("x")}))[0].code == 200


def read_until_cut(port, path, body):
    """POST on a plain socket; what arrived, and ConnectionResetError if it ended so."""
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n"
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode() + data)
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except ConnectionResetError as e:
            return got, e
    return got, None


@pytest_twisted.ensureDeferred
async def test_a_reset_reaches_the_client_as_econnreset_after_the_events_that_left(fake):
    fake.faults.reset_after_chunks = 2
    # Anthropic's first token is two events written together (the block's start and the
    # delta): the first of them leaves, the second never does.
    body = {"messages": user("x"), "max_tokens": 9, "stream": True}
    got, error = await wait(deferToThread(read_until_cut, fake.port, "/v1/messages", body))
    assert isinstance(error, ConnectionResetError)
    names = [line for line in got.decode().splitlines() if line.startswith("event: ")]
    assert names == ["event: message_start", "event: content_block_start"]
    fake.faults.reset_after_chunks = 0
    body = {"messages": user("x")}
    got, error = await wait(deferToThread(read_until_cut, fake.port, "/v1/messages", body))
    assert (got, type(error)) == (b"", ConnectionResetError)


@pytest_twisted.ensureDeferred
async def test_cut_once_cuts_one_stream_and_the_host_then_works_again(fake):
    fake.config.tokens_per_second = 100  # two streams run side by side
    fake.faults.cut_once = True
    fake.faults.drop_after_chunks = 3
    one, two = await open_stream(fake, max_tokens=10), await open_stream(fake, max_tokens=10)
    await wait(one.done)
    await wait(two.done)
    # Whichever got to its 3rd event first was cut; the other, and what follows, are whole.
    assert sorted(s.reason.check(ResponseDone) is None for s in (one, two)) == [False, True]
    assert fake.faults.drop_after_chunks is None  # the switch turned itself off at the cut
    fake.faults.stall_after_chunks = 2
    stalled = await open_stream(fake)
    await until(lambda: fake.faults.stall_after_chunks is None)  # stalled, and switched off
    whole = await open_stream(fake, max_tokens=3)
    await wait(whole.done)
    assert whole.reason.check(ResponseDone)
    assert stalled.data.count(b"data: ") == 2 and not stalled.done.called
    stalled.transport.stopProducing()
    await until(lambda: fake.counters.in_flight == 0)
    assert (fake.counters.dropped, fake.counters.aborted) == (1, 1)


@pytest_twisted.ensureDeferred
async def test_stall_after_chunks_goes_silent_with_the_connection_open(fake):
    fake.faults.stall_after_chunks = 2
    stream = await open_stream(fake, n=2, max_tokens=20)
    await wait(stream.events)
    # A whole other answer is generated meanwhile; the stalled stream gets nothing more.
    response, _ = await post(fake, "/v1/chat/completions", {"messages": user("other")})
    assert response.code == 200
    assert stream.data.count(b"data: ") == 2 and not stream.done.called
    assert fake.counters.in_flight == 1
    stream_transport = stream.transport
    stream_transport.stopProducing()  # the client gives up
    await until(lambda: fake.counters.aborted == 1)
    assert fake.counters.in_flight == 0 and fake.cache.busy == 0
    assert [c.outcome for c in fake.counters.completions] == ["done", "aborted"]


@pytest_twisted.ensureDeferred
async def test_loading_answers_503_loading_model_everywhere_until_off(fake):
    fake.faults.loading = True
    loading = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
    for path in ("/health", "/props"):
        response, body = await get(fake, path)
        assert (response.code, body) == (503, loading)
    response, body = await post(fake, "/v1/chat/completions", {"messages": user("x")})
    assert (response.code, body) == (503, loading)
    fake.faults.loading = False
    assert (await get(fake, "/health"))[0].code == 200


def test_bad_fault_values_are_refused_before_anything_changes():
    fake = FakeLlama(reactor)
    with pytest.raises(ValueError, match="drop_after_chunks"):
        fake.faults.drop_after_chunks = -1
    with pytest.raises(ValueError, match="refuse"):
        fake.faults.update({"hang": True, "refuse": "yes"})
    assert not fake.faults.hang


@pytest_twisted.ensureDeferred
async def test_the_control_port_stays_open_while_refuse_closes_the_main_one():
    fake = FakeLlama(reactor, models=["m"])
    await fake.start(control_port=0)
    try:
        control = fake.control_url
        response = await wait(client().post(control + "/_fake/faults", json={"refuse": True}))
        assert response.code == 200
        await wait(fake.settle())
        with pytest.raises(ConnectionRefusedError):
            await get(fake, "/health")
        response = await wait(client().post(control + "/_fake/faults", json={"refuse": False}))
        assert response.code == 200 and json.loads(await response.content())["refuse"] is False
        await wait(fake.settle())
        assert (await get(fake, "/health"))[0].code == 200
        other = await wait(client().get(control + "/health"))
        assert other.code == 404  # the control port serves /_fake/* only
        await other.content()
    finally:
        await fake.stop()


def test_the_fake_stops_generating_while_its_client_does_not_read():
    clock = Clock()
    fake = FakeLlama(clock, models=["m"], tokens_per_second=100)
    server = fake._connections.buildProtocol(None)
    received = []

    class Reader:
        def makeConnection(self, transport):
            self.transport = transport

        def dataReceived(self, data):
            received.append(data)

        def connectionLost(self, reason):
            pass

    reader = Reader()
    pump = connect(server, FakeTransport(server, True), reader, FakeTransport(reader, False))
    body = json.dumps({"messages": user("go on"), "stream": True, "max_tokens": 1000}).encode()
    reader.transport.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
        % (len(body), body)
    )

    def run(seconds: float) -> None:
        for _ in range(int(seconds * 100)):
            clock.advance(0.01)
            pump.flush()

    run(0.5)
    assert fake.counters.predicted_tokens >= 40
    server.wrappedProtocol.pauseProducing()  # the client's socket buffer is full
    run(0.05)  # what was under way finishes its step
    stopped_at = fake.counters.predicted_tokens
    run(5)
    assert fake.counters.predicted_tokens == stopped_at  # no generation, no memory growth
    server.wrappedProtocol.resumeProducing()
    run(0.5)
    assert fake.counters.predicted_tokens > stopped_at + 30
