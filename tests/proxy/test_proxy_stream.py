"""Streams pass through as they are made, never buffered whole, and breaks stay visible."""

import json
import socket
import tracemalloc

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol
from twisted.web.client import ResponseDone
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from tests.support.harness import MODEL, start_crossbar, start_fakes, wait

ONE = {"convo": {"hosts": ["titan"], "default_model": MODEL}}


class Collector(Protocol):
    """Collects a response body; `arrivals` holds (bytes, fake's chunks_sent) per delivery."""

    def __init__(self, fake=None):
        self.fake = fake
        self.data = b""
        self.arrivals = []
        self.done = Deferred()

    def dataReceived(self, data):
        self.data += data
        self.arrivals.append((data, self.fake.counters.chunks_sent if self.fake else 0))

    def connectionLost(self, reason):
        self.reason = reason
        self.done.callback(None)


async def stream(crossbar, route="convo", **extra):
    body = {"model": MODEL, "stream": True, **extra}
    body.setdefault("messages", [{"role": "user", "content": "Stream me a story."}])
    response = await crossbar.client().post(
        crossbar.url(route, "/v1/chat/completions"), data=json.dumps(body).encode()
    )
    return response


@pytest_twisted.ensureDeferred
async def test_a_streamed_token_reaches_the_client_before_the_next_is_generated():
    fakes = await start_fakes("titan", tokens_per_second=20)
    crossbar = await start_crossbar(fakes, ONE)
    try:
        response = await wait(stream(crossbar, max_tokens=5))
        collector = Collector(fakes["titan"])
        response.deliverBody(collector)
        await wait(collector.done)
        events = [a for a in collector.arrivals if a[0].startswith(b"data: {")]
        # Each content event arrived while the fake had sent no more than that event.
        for i, (_, sent) in enumerate(events[:5], start=1):
            assert sent <= i, collector.arrivals
        assert collector.data.rstrip().endswith(b"data: [DONE]")
    finally:
        await crossbar.stop()


class Firehose(Resource):
    """An upstream that streams `total` bytes of SSE as fast as its socket takes them."""

    isLeaf = True

    def __init__(self, total):
        super().__init__()
        self.total = total
        self.sent = 0
        self.finished = Deferred()

    def render_POST(self, request):
        request.setHeader(b"content-type", b"text/event-stream")
        line = (
            b"data: "
            + json.dumps({"id": "x", "choices": [{"delta": {"content": "y" * 60000}}]}).encode()
            + b"\n\n"
        )
        hose = self

        class Pull:
            def resumeProducing(self):
                if hose.sent >= hose.total:
                    request.unregisterProducer()
                    request.finish()
                    hose.finished.callback(None)
                    return
                request.write(line)
                hose.sent += len(line)

            def stopProducing(self):
                if not hose.finished.called:
                    hose.finished.callback(None)

        request.registerProducer(Pull(), False)
        return NOT_DONE_YET


async def quiet(period, probe, deadline=20.0):
    """Wait until probe() stops changing for `period` seconds (or the deadline passes)."""
    from twisted.internet.task import deferLater

    last, still, waited = probe(), 0.0, 0.0
    while still < period and waited < deadline:
        await deferLater(reactor, 0.05, lambda: None)
        waited += 0.05
        now = probe()
        still = still + 0.05 if now == last else 0.0
        last = now
    return last


@pytest_twisted.ensureDeferred
async def test_a_client_that_reads_nothing_pauses_the_upstream_and_costs_bounded_memory():
    hose = Firehose(total=50 * 1024 * 1024)
    upstream = reactor.listenTCP(0, Site(hose), interface="127.0.0.1")
    url = f"http://127.0.0.1:{upstream.getHost().port}"
    hosts = {"titan": {"url": url, "models": [MODEL], "parallel": 1, "ctx": 100000}}
    crossbar = await start_crossbar({}, ONE, hosts=hosts)
    sock = socket.create_connection(("127.0.0.1", crossbar.port.getHost().port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        body = json.dumps({"model": MODEL, "stream": True, "prompt": "go"}).encode()
        sock.sendall(
            b"POST /r/convo/v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        sent = await quiet(0.5, lambda: hose.sent)
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert 0 < sent < 20 * 1024 * 1024, sent  # paused: most of 50 MB never left the host
        assert grown < 4 * 1024 * 1024, grown
    finally:
        sock.close()
        await crossbar.stop()
        await upstream.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_host_dying_mid_stream_gives_an_error_event_and_a_cut_response_never_done(launch):
    fakes = await start_fakes("titan", parallel=1)
    fakes["titan"].faults.drop_after_chunks = 3
    # resume_attempts = 0: the stream is not continued (tests/proxy/test_resume.py tells that)
    alone = {"convo": {**ONE["convo"], "resume_attempts": 0}}
    crossbar = await launch(fakes, alone, parallel=1)
    rows = []
    crossbar.parts.usage.observers.append(rows.append)
    response = await wait(stream(crossbar, max_tokens=20))
    assert response.code == 200
    collector = Collector()
    response.deliverBody(collector)
    await wait(collector.done)
    reason = collector.reason
    assert b"[DONE]" not in collector.data
    last = collector.data.strip().split(b"\n\n")[-1]
    assert json.loads(last[len(b"data: ") :])["error"]["type"] == "api_error"
    assert reason.check(ResponseDone) is None  # cut, not ended: no terminating chunk
    assert crossbar.parts.limiter.in_flight("titan", MODEL) == 0
    (row,) = rows
    assert row.error and row.completion_tokens == 3
    fakes["titan"].faults.drop_after_chunks = None
    ok = await wait(stream(crossbar, max_tokens=3))
    assert ok.code == 200 and b"[DONE]" in await ok.content()
