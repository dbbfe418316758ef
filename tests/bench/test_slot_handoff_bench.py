"""bench/proxy/slot_handoff.py's host and arithmetic, so the bench cannot rot between sittings: the tiny
host (bench/proxy/slot_host.py) reads requests and notes when each came, keeps its one slot's queue
in arrival order and records when each answer ended; the bench counts a hand-off only where a
request was waiting, and splits crossbar's share of one by its stamps.

The host runs in this thread on real sockets (port 0), stepped by the test, on a clock the test
moves: nothing waits for time to pass, so a busy machine cannot make it flaky."""

import json
import socket

import pytest

from bench.proxy import handoff_figures, slot_host

CHAT = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}'
STREAM = b'{"model": "tiny", "messages": [], "stream": true}'


def chat(bench_id: str, body: bytes = CHAT) -> bytes:
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nX-Bench-Id: {bench_id}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


# --- reading requests -------------------------------------------------------------------------


def test_a_request_arrives_when_its_first_byte_is_read_however_it_is_cut():
    reader = slot_host.RequestReader()
    data = chat("a")
    assert reader.feed(data[:10], now=100) == []
    assert reader.feed(data[10:-5], now=200) == []
    (request,) = reader.feed(data[-5:], now=300)
    assert (request.method, request.path, request.arrived) == ("POST", "/v1/chat/completions", 100)
    assert request.headers["x-bench-id"] == "a" and request.body == CHAT
    assert request.keep_alive


def test_pipelined_requests_each_arrive_and_connection_close_is_heard():
    reader = slot_host.RequestReader()
    get = b"GET /health HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
    first, second = reader.feed(chat("a") + get, now=7)
    assert first.headers["x-bench-id"] == "a" and first.keep_alive
    assert (second.path, second.arrived, second.keep_alive) == ("/health", 7, False)
    (third,) = reader.feed(chat("b"), now=9)
    assert third.arrived == 9


def test_a_chunked_body_is_refused():
    reader = slot_host.RequestReader()
    with pytest.raises(slot_host.BadRequest):
        reader.feed(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", now=1)


# --- the slot -------------------------------------------------------------------------------------


def job(name: str, connection: int, arrived: int) -> slot_host.Job:
    return slot_host.Job(name, connection, arrived, stream=False, keep_alive=True)


def test_the_slot_takes_waiting_requests_in_arrival_order_one_at_a_time():
    slot = slot_host.Slot()
    for i, name in enumerate("abc"):
        slot.offer(job(name, i, arrived=10 + i))
    assert slot.take(now=20).id == "a"
    assert slot.take(now=21) is None  # busy
    record = slot.end(now=30)
    assert record == slot_host.Record("a", 0, arrived=10, taken=20, ended=30)
    assert slot.take(now=31).id == "b"
    slot.drop(1)  # b's connection closed: its slot frees, unrecorded
    assert slot.take(now=32).id == "c"
    assert slot.take_records() == [record] and slot.take_records() == []


# --- the host, on real sockets ----------------------------------------------------------------


class Clock:
    """Monotonic nanoseconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def host():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    running = slot_host.TinyHost(listener, gen_ms=5.0, tokens=3, clock=Clock())
    yield running
    running.close()


def step_until(host: slot_host.TinyHost, done, steps: int = 100) -> None:
    """Step the host until `done()`; each step waits for the sockets at most 0.2 s."""
    for _ in range(steps):
        if done():
            return
        host.step(0.2)
    raise AssertionError("the host never got there")


def connect(host: slot_host.TinyHost) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", host.port), timeout=5)
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client


def read_answer(client: socket.socket) -> tuple[bytes, bytes]:
    """One answer's head and body: by its Content-Length, or up to a chunked body's end."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += client.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    if b"Content-Length:" in head:
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        while len(body) < length:
            body += client.recv(65536)
        return head, body
    while not body.endswith(b"0\r\n\r\n"):
        body += client.recv(65536)
    return head, body


def test_the_host_answers_what_crossbar_asks_before_it_sends_work(host):
    client = connect(host)
    answers = {}
    for path in ("/health", "/props", "/v1/models"):
        client.sendall(f"GET {path} HTTP/1.1\r\nHost: h\r\n\r\n".encode())
        step_until(host, lambda: host.accepted == 1)
        host.step(0.2)
        head, body = read_answer(client)
        assert head.startswith(b"HTTP/1.1 200 OK"), head
        answers[path] = json.loads(body)
    props = answers["/props"]
    assert props["total_slots"] == 1 and props["default_generation_settings"]["n_ctx"] == 4096
    assert answers["/v1/models"]["data"][0]["id"] == "tiny"
    client.close()


def test_a_request_that_comes_while_the_slot_is_busy_is_taken_the_moment_the_answer_ends(host):
    clock, gen = host.clock, 5_000_000
    first, second = connect(host), connect(host)
    first.sendall(chat("a"))
    step_until(host, lambda: host.slot.current is not None)
    clock.now += 1_000
    second.sendall(chat("b"))
    step_until(host, lambda: len(host.slot.queue) == 1)
    assert host.slot.current.id == "a"
    clock.now = host.slot.current.taken + gen  # a's generation is over
    host.step(0)
    head, body = read_answer(first)
    answer = json.loads(body)
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert answer["usage"]["completion_tokens"] == 3 and answer["timings"]["predicted_n"] == 3
    assert host.slot.current.id == "b"  # taken at once: the same instant a ended
    clock.now += gen
    host.step(0)
    read_answer(second)
    a, b = host.slot.take_records()
    start = 1_000_000
    assert (a.id, a.arrived, a.taken, a.ended) == ("a", start, start, start + gen)
    assert (b.id, b.arrived, b.taken, b.ended) == ("b", start + 1_000, a.ended, a.ended + gen)
    assert a.connection != b.connection
    first.close()
    second.close()


def test_a_streamed_answer_ends_with_its_last_event_and_the_records_are_read_once(host):
    client = connect(host)
    client.sendall(chat("s", STREAM))
    step_until(host, lambda: host.slot.current is not None)
    for _ in range(3):  # the role's event at once, then the three tokens' spread over 5 ms
        host.clock.now += 5_000_000 // 3 + 1
        host.step(0)
    head, body = read_answer(client)
    assert b"text/event-stream" in head and b"Transfer-Encoding: chunked" in head
    events = [line for line in body.split(b"\n") if line.startswith(b"data: ")]
    assert len(events) == 1 + 3 + 1  # role, three tokens, [DONE]
    assert b'"usage"' in events[-2] and events[-1] == b"data: [DONE]"
    client.sendall(b"GET /_bench/records HTTP/1.1\r\nHost: h\r\n\r\n")
    host.step(0.2)
    _, body = read_answer(client)
    state = json.loads(body)
    assert [r["id"] for r in state["records"]] == ["s"] and state["accepted"] == 1
    client.sendall(b"GET /_bench/records HTTP/1.1\r\nHost: h\r\n\r\n")
    host.step(0.2)
    assert json.loads(read_answer(client)[1])["records"] == []
    client.close()


# --- the bench's arithmetic ---------------------------------------------------------------------


def record(name: str, connection: int, arrived: int, taken: int, ended: int) -> dict:
    return {
        "id": name,
        "connection": connection,
        "arrived": arrived,
        "taken": taken,
        "ended": ended,
    }


def test_a_hand_off_counts_only_where_the_next_request_was_already_sent():
    records = [
        record("w", 1, 0, 0, 90),  # a warm-up's: sent in no measured round
        record("a", 1, 100, 100, 200),
        record("b", 1, 230, 240, 300),  # sent at 150, before a ended: a hand-off
        record("c", 2, 500, 500, 600),  # sent at 450, after b ended: the slot was idle
        record("d", 3, 550, 610, 700),  # sent at 540: waited at the host (direct)
    ]
    sent = {"a": 50, "b": 150, "c": 450, "d": 540}
    found = handoff_figures.handoffs(records, sent)
    assert found == [
        handoff_figures.Handoff(idle_ns=40, first_byte_ns=30, same_connection=True, ended=200),
        handoff_figures.Handoff(idle_ns=10, first_byte_ns=-50, same_connection=False, ended=600),
    ]


def test_spreads_are_nearest_rank():
    spread = handoff_figures.Spread.of([float(v) for v in range(1, 101)])
    assert (spread.n, spread.p50, spread.p90, spread.p99, spread.max) == (100, 50, 90, 99, 100)
    assert handoff_figures.Spread.of([]).n == 0


def test_crossbar_s_share_of_a_hand_off_is_split_at_its_stamps():
    # label, monotonic ns, the reactor thread's CPU ns
    stamps = [
        ("admit", 900, 0),  # before the window: an acquire's, not this hand-off's
        ("woke", 1_100, 10_000),
        ("host_data", 1_200, 10_100),
        ("ended", 1_500, 10_350),
        ("finish", 1_700, 10_550),
        ("finished", 1_750, 10_600),
        ("admit", 1_760, 10_610),
        ("attempt", 1_900, 10_700),
        ("request", 1_950, 10_750),
        ("usage", 2_050, 10_850),  # after the request went: none of the hand-off's
    ]
    found = handoff_figures.breakdown([(1_000, 2_000), (3_000, 4_000)], stamps)
    assert found.skipped == 1  # the second window has no stamp
    assert found.wall == {
        "woke": [0.1],
        "host_data": [0.1],
        "ended": [0.3],
        "finish": [0.2],
        "finished": [0.05],
        "admit": [0.01],
        "attempt": [0.14],
        "request": [0.05],
        "arrived": [0.05],
    }
    assert found.cpu["ended"] == [0.25] and found.cpu["attempt"] == [0.09]
    assert found.cpu["woke"] == [] and found.cpu["arrived"] == []


def test_when_crossbar_was_awake_already_its_wake_up_costs_nothing():
    stamps = [
        ("woke", 500, 0),
        ("host_data", 1_200, 100),
        ("ended", 1_300, 200),
        ("finish", 1_400, 300),
        ("finished", 1_450, 350),
        ("admit", 1_460, 360),
        ("attempt", 1_500, 400),
        ("request", 1_550, 450),
    ]
    found = handoff_figures.breakdown([(1_000, 1_600)], stamps)
    assert found.wall["woke"] == [0.0] and found.wall["host_data"] == [0.2]
    assert found.cpu["host_data"] == []  # no wake-up in the window to count from
    assert found.cpu["ended"] == [0.1]


def test_a_crossbar_that_frees_the_slot_before_the_relay_ends_has_nothing_in_finish():
    stamps = [
        ("woke", 1_100, 0),
        ("host_data", 1_200, 100),
        ("ended", 1_300, 200),
        ("admit", 1_320, 220),
        ("attempt", 1_400, 300),
        ("request", 1_450, 350),
        ("finish", 1_500, 400),  # the relay ends after the next request went
        ("finished", 1_550, 450),
    ]
    found = handoff_figures.breakdown([(1_000, 1_600)], stamps)  # the host reads it late
    assert found.skipped == 0
    assert found.wall["finish"] == [0.0] and found.wall["finished"] == [0.0]
    assert found.wall["admit"] == [0.02] and found.cpu["admit"] == [0.02]
    assert found.wall["arrived"] == [0.15]
