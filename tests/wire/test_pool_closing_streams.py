"""A host that closes its connection after every streamed answer (llama-server does, while it
says Keep-Alive): once learned, no request is sent on a connection about to close, and the
next one finds a connection opened ahead. Told on the in-memory network."""

from tests.support.memnet import CHAT_PATH, Host, chat, start


def stream_then_close(host: Host) -> None:
    host.transport.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
        b"Keep-Alive: timeout=5, max=100\r\n\r\n"
    )
    event = b'data: {"id": "c1", "choices": [{"delta": {"content": "hi"}}]}\n\n'
    host.transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event))
    host.transport.loseConnection()


def test_a_host_closing_after_each_stream_is_learned_and_no_request_goes_twice():
    crossbar = start({"convo": {"hosts": ["titan"]}}, hosts=("titan",), parallel=1)
    net = crossbar.net
    net.on_request["titan"] = stream_then_close
    first = crossbar.post(CHAT_PATH, chat("first"))
    assert first.status == 200
    pool = crossbar.parts.upstream._pool
    (origin,) = pool._origins.values()
    assert origin.closes_after_chunked  # its connection went as soon as the stream ended
    # Three turns queue behind a fourth's stream: each goes the moment the slot frees, on a
    # connection opened ahead, never on the one the host is closing.
    net.on_request["titan"] = lambda host: None  # the fourth is answered by hand
    fourth = crossbar.post(CHAT_PATH, chat("fourth"))
    waiting = [crossbar.post(CHAT_PATH, chat(f"w{i}")) for i in range(3)]
    net.on_request["titan"] = stream_then_close
    holder = [h for h in net.connections["titan"] if h.requests() and not h.lost][-1]
    stream_then_close(holder)
    net.flush()
    assert fourth.status == 200 and all(c.status == 200 for c in waiting)
    sent = [h.requests() for h in net.connections["titan"]]
    assert sum(sent) == 5 and max(sent) == 1  # five requests, each sent once
    assert crossbar.parts.limiter.in_flight("titan", "qwen-coder") == 0
