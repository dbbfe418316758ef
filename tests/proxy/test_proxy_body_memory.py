"""Request bodies held at once, over every connection, stay within `max_body_memory`: a body
takes its bytes as they arrive (a body declared and never sent holds nothing), one whose
declared length is more than what is left gets 503 with Retry-After in the caller's dialect
before it is read, one whose bytes run past the limit gets it as they do, and a request gives
its bytes back when it is answered, refused or its client goes (in memory)."""

import gc
import json
import tracemalloc

from crossbar.config.values import parse_config
from tests.support.memnet import MODEL, chat, start

ROUTES = {"convo": {"hosts": ["titan"], "default_model": MODEL}}
MiB = 1024 * 1024
CHAT = b"POST /r/convo/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
MESSAGES = b"POST /r/convo/v1/messages HTTP/1.1\r\nHost: x\r\n"


def declaring(length: int, line: bytes = CHAT) -> bytes:
    return line + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % length


def error_of(client) -> tuple[int | None, dict]:
    return client.status, json.loads(client.received.split(b"\r\n\r\n", 1)[1])


def test_a_body_takes_memory_as_its_bytes_arrive_and_one_that_cannot_fit_gets_503_at_once():
    crossbar = start(ROUTES, hosts=("titan",), max_body="1MiB", max_body_memory="2MiB")
    memory = crossbar.sites.proxy.memory
    held = [crossbar.raw(declaring(MiB) + b"{" + b" " * (MiB - 1001)) for _ in range(2)]
    assert all(c.status is None and not c.lost for c in held)
    assert memory.held == 2 * MiB - 2000  # what arrived, not what was declared

    late = crossbar.raw(declaring(MiB) + b"{")  # more than memory has left: refused at once
    status, error = error_of(late)
    assert status == 503 and late.lost
    assert late.header(b"Retry-After") == b"5"
    assert error["error"]["type"] == "unavailable_error" and "max_body_memory" in str(error)
    assert memory.held == 2 * MiB - 2000  # the refused body took nothing

    small = crossbar.raw(declaring(1000) + b"{")  # what fits is still taken
    assert small.status is None and memory.held == 2 * MiB - 1999

    held[0].transport.loseConnection()  # a client gone gives its bytes back
    crossbar.net.flush()
    assert memory.held == MiB - 999
    again = crossbar.raw(declaring(MiB) + b"{")
    assert again.status is None and not again.lost
    assert crossbar.net.connections == {}  # nothing reached a host


def test_a_body_whose_bytes_run_past_what_memory_has_left_gets_503_as_they_arrive():
    crossbar = start(ROUTES, hosts=("titan",), max_body="1MiB", max_body_memory="1MiB")
    memory = crossbar.sites.proxy.memory
    first = crossbar.raw(declaring(MiB // 2) + b"{")
    second = crossbar.raw(declaring(MiB // 2 + 10) + b"{")  # fits what is left when declared
    first.transport.write(b" " * (MiB // 2 - 2))  # all but its last byte
    second.transport.write(b" " * (MiB // 2 + 5))  # past the limit: refused, its bytes given back
    crossbar.net.flush()
    status, error = error_of(second)
    assert status == 503 and second.lost and "max_body_memory" in str(error)
    assert memory.held == MiB // 2 - 1 and first.status is None


def test_heads_declaring_all_of_max_body_memory_with_no_body_stop_no_other_request():
    """Four heads that declare 64 MiB (max_body) and never send a byte of it hold none of
    max_body_memory (256 MiB): an ordinary request is served beside them, and they are closed
    by body_timeout, whose wait starts at the end of the head."""
    crossbar = start(ROUTES, hosts=("titan",), body_timeout="30s")
    net = crossbar.net
    net.on_request["titan"] = lambda host: host.answer()
    stalled = [crossbar.raw(declaring(64 * MiB)) for _ in range(4)]
    assert crossbar.sites.proxy.memory.held == 0
    ordinary = crossbar.post("/r/convo/v1/chat/completions", chat())
    assert ordinary.status == 200
    net.clock.advance(29)
    net.flush()
    assert not any(c.lost for c in stalled)
    net.clock.advance(1)
    net.flush()
    for client in stalled:
        status, error = error_of(client)
        assert status == 408 and "body" in error["error"]["message"] and client.lost


def test_a_body_refused_on_anthropics_path_gets_overloaded_error():
    crossbar = start(ROUTES, hosts=("titan",), max_body="1MiB", max_body_memory="1MiB")
    crossbar.raw(declaring(MiB, MESSAGES) + b"{" + b" " * (MiB - 2))
    late = crossbar.raw(declaring(10, MESSAGES))
    status, error = error_of(late)
    assert status == 503 and error["type"] == "error"
    assert error["error"]["type"] == "overloaded_error"


def test_a_chunked_body_takes_each_chunks_bytes_as_they_arrive():
    crossbar = start(ROUTES, hosts=("titan",), max_body="1MiB", max_body_memory="1MiB")
    memory = crossbar.sites.proxy.memory
    head = CHAT + b"Transfer-Encoding: chunked\r\n\r\n"
    first = crossbar.raw(head + b"%x\r\n{" % (MiB // 2) + b" " * (MiB // 2 - 1))
    second = crossbar.raw(head + b"1\r\n{\r\n")
    assert memory.held == MiB // 2 + 1 and first.status is None and second.status is None
    # A chunk larger than memory has left refuses its body at once, and gives back what it held.
    second.transport.write(b"%x\r\n" % (MiB // 2))
    crossbar.net.flush()
    assert second.status == 503 and second.lost
    assert memory.held == MiB // 2


def test_an_answered_request_gives_its_bytes_back():
    crossbar = start(ROUTES, hosts=("titan",))
    crossbar.net.on_request["titan"] = lambda host: host.answer()
    client = crossbar.post("/r/convo/v1/chat/completions", chat())
    assert client.status == 200
    assert crossbar.sites.proxy.memory.held == 0


def test_a_request_refused_after_its_body_arrived_gives_its_bytes_back():
    crossbar = start(ROUTES, hosts=("titan",))
    client = crossbar.post("/r/convo/v1/chat/completions", b"{not json")
    assert client.status == 400
    assert crossbar.sites.proxy.memory.held == 0


def test_a_body_over_max_body_gives_back_what_it_took():
    crossbar = start(ROUTES, hosts=("titan",), max_body="1KiB")
    head = CHAT + b"Transfer-Encoding: chunked\r\n\r\n"
    client = crossbar.raw(head + b"200\r\n" + b"x" * 512 + b"\r\n300\r\n")
    assert client.status == 413 and client.lost
    assert crossbar.sites.proxy.memory.held == 0


def test_a_chunk_that_declares_more_than_max_body_gets_413_at_once():
    crossbar = start(ROUTES, hosts=("titan",), max_body="1MiB")
    head = CHAT + b"Transfer-Encoding: chunked\r\n\r\n"
    client = crossbar.raw(head + b"%x\r\n{" % (MiB + 1))
    status, error = error_of(client)
    assert status == 413 and client.lost and error["error"]["code"] == 413
    assert crossbar.net.connections == {}


def test_chunks_that_together_declare_more_than_max_body_get_413_at_the_one_that_passes():
    crossbar = start(ROUTES, hosts=("titan",), max_body="1KiB")
    head = MESSAGES + b"Transfer-Encoding: chunked\r\n\r\n"
    client = crossbar.raw(head + b"200\r\n" + b"x" * 512 + b"\r\n201\r\n")
    status, error = error_of(client)
    assert status == 413 and error["error"]["type"] == "request_too_large"


def test_the_admin_api_holds_its_bodies_in_the_same_bound():
    crossbar = start(ROUTES, hosts=("titan",), max_body="1MiB", max_body_memory="1MiB")
    assert crossbar.sites.admin.memory is crossbar.sites.proxy.memory
    crossbar.raw(declaring(MiB) + b"{" + b" " * (MiB - 2))
    status, _ = crossbar.admin("PUT", "/api/routes/convo/pin", {"host": "titan"})
    assert status == 503


def test_a_reload_moves_the_bound_of_both_ports_and_keeps_what_is_held():
    crossbar = start(ROUTES, hosts=("titan",))
    crossbar.raw(declaring(60 * MiB) + b"{" + b" " * (60 * MiB - 2))
    lower = parse_config(
        {
            "server": {"db": ":memory:", "max_body_memory": "64MiB"},
            "hosts": {"titan": {"url": "http://titan:8080", "models": [MODEL]}},
            "routes": ROUTES,
        }
    )
    for site in (crossbar.sites.proxy, crossbar.sites.admin):
        site.reconfigure(lower)
    memory = crossbar.sites.proxy.memory
    assert (memory.limit, memory.held) == (64 * MiB, 60 * MiB - 1)
    late = crossbar.raw(declaring(5 * MiB) + b"{")  # more than is left
    assert late.status == 503


def test_a_body_of_one_byte_chunks_costs_memory_in_proportion_to_its_bytes():
    """Each chunk's data joins one buffer: 100,000 one-byte chunks hold about 100 KB (they once
    held an object and a list slot each, some 40 bytes per body byte), and max_body_memory
    counts exactly the bytes."""
    crossbar = start(ROUTES, hosts=("titan",))
    client = crossbar.raw(CHAT + b"Transfer-Encoding: chunked\r\n\r\n")
    chunks = 100_000
    reads = [b"1\r\nx\r\n" * 5000 for _ in range(chunks // 5000)]  # made before measuring
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for data in reads:
            client.transport.write(data)
            crossbar.net.flush()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert client.status is None  # the body is still arriving, all of it held
    assert crossbar.sites.proxy.memory.held == chunks
    assert grown < 2 * chunks
