"""The time rules of named keys, told on an in-memory network and a Clock: a rotated secret
works for its grace and not a moment after it, a key expires at its time, a key's minute
refills as its Retry-After said, and a request holds its place in its key's max_in_flight
until its answer ends, however it ends."""

from __future__ import annotations

import json

from crossbar.config import hash_secret
from tests.support.memnet import CHAT_PATH, Client, Crossbar, sse, start

DEV = "sk-clock-dev-0123456789"
# resume_attempts = 0: a cut stream stays cut (its continuation is told in test_resume.py).
ROUTES = {
    "convo": {
        "hosts": ["titan"],
        "default_model": "qwen-coder",
        "auth": "keys",
        "resume_attempts": 0,
    }
}
ANSWER = json.dumps(
    {"id": "c1", "choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 20}}
).encode()


def crossbar_with(**key) -> Crossbar:
    crossbar = start(
        ROUTES, hosts=("titan",), keys={"dev": {"secret": DEV, "routes": ["convo"], **key}}
    )
    crossbar.net.on_request["titan"] = lambda host: host.answer(ANSWER)
    return crossbar


def send(crossbar: Crossbar, secret: str = DEV) -> Client:
    body = json.dumps(
        {"model": "qwen-coder", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    client = crossbar.post(CHAT_PATH, body, Authorization=f"Bearer {secret}")
    assert client.status is not None, client.received
    return client


def ask(crossbar: Crossbar, secret: str = DEV) -> int:
    return send(crossbar, secret).status


def test_a_rotated_secret_works_for_its_grace_and_not_a_moment_after():
    crossbar = crossbar_with()
    clock = crossbar.net.clock
    status, rotated = crossbar.admin("POST", "/api/keys/dev/rotate", {"grace": "60s"})
    assert status == 200
    new = rotated["secret"]
    assert hash_secret(new) != hash_secret(DEV)
    clock.advance(59)
    assert ask(crossbar, DEV) == 200 and ask(crossbar, new) == 200
    clock.advance(1)
    assert ask(crossbar, DEV) == 401
    assert ask(crossbar, new) == 200


def test_a_key_expires_at_its_time():
    crossbar = crossbar_with(expires="1970-01-01T00:01:00Z")  # the Clock starts at 0
    crossbar.net.clock.advance(59)
    assert ask(crossbar) == 200
    crossbar.net.clock.advance(1)
    assert ask(crossbar) == 401


def test_a_keys_minute_refills_as_its_retry_after_said():
    crossbar = crossbar_with(tpm=100)
    assert ask(crossbar) == 200  # 50 tokens of the minute's 100
    assert ask(crossbar) == 200
    client = send(crossbar)
    assert client.status == 429
    wait = int(client.header(b"retry-after"))
    assert 12 <= wait <= 13  # its estimate, 20-odd tokens, at 100 a minute
    assert json.loads(client.received.split(b"\r\n\r\n", 1)[1])["error"]["code"] == (
        "rate_limit_exceeded"
    )
    crossbar.net.clock.advance(wait - 1)
    assert ask(crossbar) == 429  # not before
    crossbar.net.clock.advance(1)
    assert ask(crossbar) == 200


def test_a_request_holds_its_keys_place_until_its_stream_ends_even_cut_short():
    crossbar = crossbar_with(max_in_flight=1, tokens_per_day=10_000)
    rows: list = []
    crossbar.parts.usage.observers.append(rows.append)
    net = crossbar.net
    streaming = []
    net.on_request["titan"] = lambda host: (streaming.append(host), sse(host, 7))
    first = crossbar.post(
        CHAT_PATH,
        json.dumps({"model": "qwen-coder", "stream": True, "messages": []}).encode(),
        Authorization=f"Bearer {DEV}",
    )
    assert first.status == 200 and len(streaming) == 1
    assert ask(crossbar) == 429  # its one place is taken while the stream runs
    streaming[0].transport.loseConnection()  # the host cuts the stream after 7 tokens
    net.flush()
    tenants = crossbar.parts.tenants
    used = tenants.meter.status(tenants.book.get("dev"), net.clock.seconds())
    assert used["in_flight"] == 0
    (row,) = [r for r in rows if r.status == 200]
    assert [r.status for r in rows] == [429, 200] and all(r.key == "dev" for r in rows)
    assert row.completion_tokens == 7 and row.error
    # Charged: the 7 tokens delivered and the prompt it was admitted on (the cut came before
    # the host's last chunk, which reports the prompt).
    assert 7 <= used["tokens_today"] <= 7 + 10
    net.on_request["titan"] = lambda host: host.answer(ANSWER)
    assert ask(crossbar) == 200
