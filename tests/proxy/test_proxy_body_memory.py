"""Request bodies held at once, over every connection, stay within `max_body_memory`: a body
that does not fit gets 503 with Retry-After in the caller's dialect before it is read, and a
request gives its bytes back when it is answered, refused or its client goes (in memory, with
the default limits: nothing here sends more than a few bytes of the bodies it declares)."""

import json

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


def test_a_body_that_does_not_fit_gets_503_at_once_until_another_is_released():
    crossbar = start(ROUTES, hosts=("titan",))  # max_body 64MiB, max_body_memory 256MiB
    memory = crossbar.sites.proxy.memory
    held = [crossbar.raw(declaring(60 * MiB) + b"{") for _ in range(4)]  # 240 MiB declared
    assert all(c.status is None and not c.lost for c in held)
    assert memory.held == 240 * MiB

    late = crossbar.raw(declaring(60 * MiB) + b"{")
    status, error = error_of(late)
    assert status == 503 and late.lost
    assert late.header(b"Retry-After") == b"5"
    assert error["error"]["type"] == "unavailable_error" and "max_body_memory" in str(error)
    assert memory.held == 240 * MiB  # the refused body took nothing

    small = crossbar.raw(declaring(10 * MiB) + b"{")  # what fits is still taken
    assert small.status is None and memory.held == 250 * MiB

    held[0].transport.loseConnection()  # a client gone gives its bytes back
    crossbar.net.flush()
    assert memory.held == 190 * MiB
    again = crossbar.raw(declaring(60 * MiB) + b"{")
    assert again.status is None and not again.lost
    assert crossbar.net.connections == {}  # nothing reached a host


def test_a_body_refused_on_anthropics_path_gets_overloaded_error():
    crossbar = start(ROUTES, hosts=("titan",), max_body="1MiB", max_body_memory="1MiB")
    crossbar.raw(declaring(MiB, MESSAGES) + b"{")
    late = crossbar.raw(declaring(10, MESSAGES))
    status, error = error_of(late)
    assert status == 503 and error["type"] == "error"
    assert error["error"]["type"] == "overloaded_error"


def test_a_chunked_body_takes_each_chunk_as_it_is_declared():
    crossbar = start(ROUTES, hosts=("titan",), max_body="1MiB", max_body_memory="1MiB")
    memory = crossbar.sites.proxy.memory
    head = CHAT + b"Transfer-Encoding: chunked\r\n\r\n"
    first = crossbar.raw(head + b"%x\r\n{" % (MiB // 2))
    second = crossbar.raw(head + b"%x\r\n{" % (MiB // 4))
    assert memory.held == 3 * MiB // 4 and first.status is None and second.status is None
    # A new chunk that does not fit refuses its body, and gives back what it held.
    second.transport.write(b"x" * (MiB // 4 - 1) + b"\r\n%x\r\n" % (MiB // 2))
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
    crossbar.raw(declaring(MiB) + b"{")
    status, _ = crossbar.admin("PUT", "/api/routes/convo/pin", {"host": "titan"})
    assert status == 503


def test_a_reload_moves_the_bound_of_both_ports_and_keeps_what_is_held():
    crossbar = start(ROUTES, hosts=("titan",))
    crossbar.raw(declaring(60 * MiB) + b"{")
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
    assert (memory.limit, memory.held) == (64 * MiB, 60 * MiB)
    late = crossbar.raw(declaring(5 * MiB) + b"{")
    assert late.status == 503
