"""Named client keys on the request path, told through the official OpenAI and Anthropic
clients: a key is who sent a request (X-Crossbar-Key, its usage row), a key outside its scope
gets 403, an unknown, blocked or expired one 401, one over a limit 429 with Retry-After, each in
the caller's dialect; and a key's limits are charged before the request runs."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred, DeferredList, ensureDeferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol
from twisted.internet.threads import deferToThread

from crossbar.config import hash_secret
from crossbar.wire import OPENAI_CHAT
from tests.support.harness import MODEL, Crossbar, start_crossbar, start_fakes, until, wait

ALICE = "sk-alice-5f0c1d2e3b4a"
BOB = "sk-bob-9e8d7c6b5a40"
CI = "sk-ci-00112233445566"
GONE = "sk-gone-aabbccddeeff"
OLD = "sk-old-112233445566"
TIGHT = "sk-tight-0a1b2c3d4e5f"
LEGACY = "legacy-anonymous-key-1"
HELLO = [{"role": "user", "content": "Refactor the parser."}]
ROUTES = {
    "team": {"hosts": ["titan"], "default_model": MODEL, "auth": "keys",
             "aliases": {"claude-*": MODEL}},
    "other": {"hosts": ["titan"], "default_model": MODEL, "auth": "keys"},
    "open": {"hosts": ["titan"], "default_model": MODEL},
    "legacy": {"hosts": ["titan"], "default_model": MODEL, "keys": [LEGACY]},
}  # fmt: skip
KEYS = {
    "alice": {"secret": ALICE, "routes": ["team", "legacy"]},
    "bob": {"secret": BOB, "routes": ["other"]},
    "ci": {"secret_sha256": hash_secret(CI), "routes": ["team"], "models": ["llama-*"]},
    "gone": {"secret": GONE, "routes": ["team"], "blocked": True},
    "old": {"secret": OLD, "routes": ["team"], "expires": "2020-01-01"},
    "tight": {"secret": TIGHT, "routes": ["team", "open"], "rpm": 1},
}
CLAUDE = "claude-sonnet-4-5-20250929"
pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")


@pytest_twisted.async_yield_fixture
async def crossbar():
    fakes = await start_fakes("titan", tokens_per_second=2000)
    running = await start_crossbar(fakes, ROUTES, keys=KEYS, parallel=2)
    rows: list = []
    running.parts.usage.observers.append(rows.append)
    _ROWS[id(running)] = rows
    yield running
    del _ROWS[id(running)]
    await running.stop()


_ROWS: dict[int, list] = {}


def rows_of(crossbar: Crossbar) -> list:
    """The usage rows the crossbar of the fixture recorded, in order."""
    return _ROWS[id(crossbar)]


def gpt(crossbar: Crossbar, route: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=crossbar.url(route, "/v1"), api_key=key, max_retries=0)


def claude(crossbar: Crossbar, route: str, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=crossbar.url(route, ""), api_key=key, max_retries=0)


async def in_thread(call: Callable[[], Any]) -> Any:
    """Run a blocking SDK call in a thread while the reactor serves crossbar; the SDK's error
    is returned, not raised."""

    def run() -> Any:
        try:
            return call()
        except (openai.APIStatusError, anthropic.APIStatusError) as e:
            return e

    return await wait(deferToThread(run), 60)


def chat(client: openai.OpenAI, model: str = MODEL, **extra: Any) -> Callable[[], Any]:
    def call() -> Any:
        with client:
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=HELLO, max_tokens=8, **extra
            )
            return raw.headers, raw.parse()

    return call


def message(client: anthropic.Anthropic) -> Callable[[], Any]:
    def call() -> Any:
        with client:
            raw = client.messages.with_raw_response.create(
                model=CLAUDE, max_tokens=8, messages=HELLO
            )
            return raw.headers, raw.parse()

    return call


@pytest_twisted.ensureDeferred
async def test_a_key_on_its_route_is_served_and_named_in_the_answer_and_the_usage(crossbar):
    headers, reply = await in_thread(chat(gpt(crossbar, "team", ALICE)))
    assert reply.choices[0].message.content
    assert headers["x-crossbar-key"] == "alice"
    headers, _ = await in_thread(message(claude(crossbar, "team", ALICE)))  # x-api-key
    assert headers["x-crossbar-key"] == "alice"
    await until(lambda: len(rows_of(crossbar)) == 2)
    assert [r.key for r in rows_of(crossbar)] == ["alice", "alice"]


@pytest_twisted.ensureDeferred
async def test_an_unknown_or_missing_key_is_401_invalid_api_key(crossbar):
    for key in ("sk-nobody-0000000000", "none"):
        error = await in_thread(chat(gpt(crossbar, "team", key)))
        assert type(error) is openai.AuthenticationError
        assert error.code == "invalid_api_key" and error.type == "authentication_error"
        assert (
            error.body["message"]
            == "route 'team' needs an API key: send Authorization: Bearer <key>"
        )
    error = await in_thread(message(claude(crossbar, "team", "sk-nobody-0000000000")))
    assert type(error) is anthropic.AuthenticationError
    assert error.body["error"]["type"] == "authentication_error"


@pytest_twisted.ensureDeferred
async def test_a_key_outside_its_routes_is_403_in_each_dialect(crossbar):
    error = await in_thread(chat(gpt(crossbar, "team", BOB)))
    assert type(error) is openai.PermissionDeniedError
    assert error.code == "permission_error" and error.type == "permission_error"
    assert error.body["message"] == "key 'bob' may not use route 'team': ask the operator"
    error = await in_thread(message(claude(crossbar, "team", BOB)))
    assert type(error) is anthropic.PermissionDeniedError
    assert error.body["error"] == {
        "type": "permission_error",
        "message": "key 'bob' may not use route 'team': ask the operator",
    }
    assert crossbar.fakes["titan"].counters.requests["/v1/chat/completions"] == 0


@pytest_twisted.ensureDeferred
async def test_a_key_outside_its_models_is_403(crossbar):
    error = await in_thread(chat(gpt(crossbar, "team", CI)))
    assert type(error) is openai.PermissionDeniedError
    assert error.body["message"] == (
        f"key 'ci' may not use model '{MODEL}' (it may use llama-*); ask the operator"
    )


@pytest_twisted.ensureDeferred
async def test_a_blocked_or_expired_key_is_401_on_every_route_even_an_open_one(crossbar):
    for key, why in ((GONE, "key 'gone' is blocked"), (OLD, "key 'old' has expired")):
        for route in ("team", "open"):
            error = await in_thread(chat(gpt(crossbar, route, key)))
            assert type(error) is openai.AuthenticationError, (route, error)
            assert error.code == "invalid_api_key" and error.body["message"].startswith(why)


@pytest_twisted.ensureDeferred
async def test_a_routes_own_keys_still_work_as_anonymous_keys_beside_named_ones(crossbar):
    headers, _ = await in_thread(chat(gpt(crossbar, "legacy", LEGACY)))
    assert "x-crossbar-key" not in headers  # anonymous: nobody to name
    headers, _ = await in_thread(chat(gpt(crossbar, "legacy", ALICE)))
    assert headers["x-crossbar-key"] == "alice"
    error = await in_thread(chat(gpt(crossbar, "legacy", BOB)))
    assert type(error) is openai.PermissionDeniedError
    error = await in_thread(chat(gpt(crossbar, "legacy", "legacy-anonymous-key-2")))
    assert type(error) is openai.AuthenticationError


@pytest_twisted.ensureDeferred
async def test_on_an_open_route_a_known_key_names_the_usage_and_any_other_is_ignored(crossbar):
    headers, _ = await in_thread(chat(gpt(crossbar, "open", BOB)))  # bob's routes: other only
    assert headers["x-crossbar-key"] == "bob"
    headers, _ = await in_thread(chat(gpt(crossbar, "open", "sk-no-key")))
    assert "x-crossbar-key" not in headers
    await until(lambda: len(rows_of(crossbar)) == 2)
    assert [r.key for r in rows_of(crossbar)] == ["bob", ""]


@pytest_twisted.ensureDeferred
async def test_a_key_over_its_limit_gets_429_with_retry_after_in_each_dialect(crossbar):
    await in_thread(chat(gpt(crossbar, "team", TIGHT)))  # its one request this minute
    error = await in_thread(chat(gpt(crossbar, "team", TIGHT)))
    assert type(error) is openai.RateLimitError
    assert error.code == "rate_limit_exceeded" and error.type == "rate_limit_error"
    assert (
        error.body["message"]
        == "key 'tight' is over its limit of 1 requests a minute (rpm); try again in 60 s"
    )
    assert error.response.headers["retry-after"] == "60"
    assert error.response.headers["x-crossbar-key"] == "tight"
    error = await in_thread(message(claude(crossbar, "team", TIGHT)))
    assert type(error) is anthropic.RateLimitError
    assert error.body["error"]["type"] == "rate_limit_error"
    assert crossbar.fakes["titan"].counters.requests["/v1/chat/completions"] == 1
    tenants = crossbar.parts.tenants
    status = tenants.meter.status(tenants.book.get("tight"), reactor.seconds())
    assert status["limited"] == {"rpm": 2}


@pytest_twisted.ensureDeferred
async def test_a_key_over_its_limit_is_refused_at_once_never_queued_behind_the_slots(crossbar):
    fake = crossbar.fakes["titan"]
    await in_thread(chat(gpt(crossbar, "open", TIGHT)))  # its one request this minute
    fake.faults.hang = True  # the host's two slots fill with requests that never end
    client = crossbar.client()
    body = json.dumps({"model": MODEL, "messages": HELLO}).encode()
    hung = [
        client.post(crossbar.url("open", "/v1/chat/completions"), data=body)
        for _ in range(3)  # two slots taken, one waiting
    ]
    await until(lambda: crossbar.parts.limiter.queued("titan", MODEL) == 1)
    started = reactor.seconds()
    error = await in_thread(chat(gpt(crossbar, "open", TIGHT)))
    assert type(error) is openai.RateLimitError
    assert reactor.seconds() - started < 5  # not the queue's wait
    assert crossbar.parts.limiter.queued("titan", MODEL) == 1  # it never joined the queue
    for d in hung:
        d.cancel()
    await DeferredList(hung, consumeErrors=True)


@pytest_twisted.ensureDeferred
async def test_fifty_concurrent_requests_of_a_1000_tpm_key_admit_1000_tokens_and_one_estimate():
    fakes = await start_fakes("titan", tokens_per_second=200)
    keys = {"burst": {"secret": ALICE, "routes": ["team"], "tpm": 1000}}
    crossbar = await start_crossbar(fakes, ROUTES, keys=keys, parallel=64)
    try:
        client = crossbar.client()

        async def one(n: int, route: str = "team", key: str = ALICE) -> tuple[int, dict]:
            task = f"Task {n:02d}: rename the module and update every import that refers to it."
            body = {"model": MODEL, "max_tokens": 60,
                    "messages": [{"role": "user", "content": task}]}  # fmt: skip
            response = await client.post(
                crossbar.url(route, "/v1/chat/completions"),
                data=json.dumps(body).encode(),
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            )
            return response.code, json.loads(await response.content())

        # The guard learns the model's tokens per character from answered prompts like these
        # (on a route without keys): the estimate each request is admitted on is then close.
        for n in range(3):
            assert (await one(90 + n, "open", "none"))[0] == 200

        meter = crossbar.parts.tenants.meter
        started = reactor.seconds()
        results = await wait(DeferredList([ensureDeferred(one(n)) for n in range(50)]), 60)
        elapsed = reactor.seconds() - started
        answers = [r for ok, r in results if ok]
        assert len(answers) == 50
        served = [body for code, body in answers if code == 200]
        refused = [body for code, body in answers if code == 429]
        assert len(served) + len(refused) == 50 and served and refused
        assert all(b["error"]["code"] == "rate_limit_exceeded" for b in refused)
        spent = sum(b["usage"]["prompt_tokens"] + b["usage"]["completion_tokens"] for b in served)
        estimate = 60 + max(b["usage"]["prompt_tokens"] for b in served)  # one request's
        refill = 1000 * elapsed / 60  # the bucket refills while the burst runs
        assert spent <= 1000 + estimate + refill, (spent, len(served), elapsed)
        assert meter.mean_completion("burst") == pytest.approx(60)
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_bursts_without_max_tokens_overshoot_a_budget_and_a_tpm_by_one_request_at_most():
    # Each answer writes 180 tokens; no request says how many it wants (LiteLLM #18730).
    fakes = await start_fakes("titan", tokens_per_second=4000, reply_tokens=180)
    keys = {
        "daily": {"secret": ALICE, "routes": ["team"], "tokens_per_day": 2000},
        "minute": {"secret": BOB, "routes": ["team"], "tpm": 1000},
    }
    crossbar = await start_crossbar(fakes, ROUTES, keys=keys, parallel=64)
    try:
        client = crossbar.client()

        async def one(n: int, key: str, route: str = "team") -> tuple[int, dict]:
            task = f"Task {n:02d}: rename the module and update every import that refers to it."
            body = {"model": MODEL, "messages": [{"role": "user", "content": task}]}
            response = await client.post(
                crossbar.url(route, "/v1/chat/completions"),
                data=json.dumps(body).encode(),
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            )
            return response.code, json.loads(await response.content())

        async def burst(key: str, n: int) -> list[dict]:
            """`n` requests of `key` at once: the usage of those served."""
            results = await wait(DeferredList([ensureDeferred(one(i, key)) for i in range(n)]), 60)
            answers = [r for ok, r in results if ok]
            assert len(answers) == n and all(code in (200, 429) for code, _ in answers)
            return [body["usage"] for code, body in answers if code == 200]

        def cost(usages: list[dict]) -> float:
            """What the keys are charged: a cached prompt token at the default weight, 0.1."""
            cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
            spent = sum(u["prompt_tokens"] + u["completion_tokens"] for u in usages)
            return spent - 0.9 * sum(cached)

        # The guard learns the model's tokens per character from answered prompts like these
        # (on a route without keys, whose mean output is its own): the prompt each request is
        # estimated at is then close, and what is left to guess is its output.
        for n in range(3):
            assert (await one(90 + n, "none", "open"))[0] == 200

        served = []
        for n in (60, 80, 100):  # the budget's key: a day's bursts, the first on a new key
            served += await burst(ALICE, n)
        one_request = max(u["prompt_tokens"] for u in served) + 180
        assert 2000 - one_request <= cost(served) <= 2000 + one_request, cost(served)

        started = reactor.seconds()
        spent = cost(await burst(BOB, 100))  # the tpm's key: the first minute of a new key
        refill = 1000 * (reactor.seconds() - started) / 60  # the bucket refills meanwhile
        assert spent <= 1000 + one_request + refill, spent
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_stream_cut_short_settles_what_was_delivered():
    fakes = await start_fakes("titan", tokens_per_second=2000)
    keys = {"ci": {"secret": ALICE, "routes": ["team"], "tokens_per_day": 100000}}
    crossbar = await start_crossbar(fakes, ROUTES, keys=keys)
    rows: list = []
    crossbar.parts.usage.observers.append(rows.append)
    try:
        fakes["titan"].faults.drop_after_chunks = 6
        client = gpt(crossbar, "team", ALICE)

        def stream() -> Any:
            with client:
                chunks = client.chat.completions.create(
                    model=MODEL, messages=HELLO, max_tokens=400, stream=True
                )
                try:
                    for _ in chunks:
                        pass
                except Exception as e:  # the cut: crossbar's error event, or the closed stream
                    return e
            return None

        await wait(deferToThread(stream), 60)
        await until(lambda: len(rows) == 1)
        (row,) = rows
        assert row.key == "ci" and row.error and 0 < row.completion_tokens < 400
        tenants = crossbar.parts.tenants
        used = tenants.meter.status(tenants.book.get("ci"), reactor.seconds())
        assert used["in_flight"] == 0
        # The budget is charged what was delivered: the completion tokens the row counts, and
        # the prompt: the row's count, or, when the cut came before llama-server reported it
        # (its last chunk), the estimate the request was admitted on.
        chars = OPENAI_CHAT.prompt_chars({"model": MODEL, "messages": HELLO})
        prompt = row.prompt_tokens or round(chars * crossbar.parts.guard.ratio(MODEL))
        assert used["tokens_today"] == pytest.approx(prompt + row.completion_tokens)
    finally:
        await crossbar.stop()


class Pipelined(Protocol):
    """Writes its requests in one write on connecting; collects what comes back until the
    connection closes."""

    def __init__(self, requests: list[bytes]) -> None:
        self.requests = requests
        self.data = b""
        self.closed: Deferred[bytes] = Deferred()

    def connectionMade(self) -> None:
        self.transport.write(b"".join(self.requests))

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Any) -> None:
        self.closed.callback(self.data)


@pytest_twisted.ensureDeferred
async def test_pipelined_requests_of_a_one_at_a_time_key_are_each_served_after_the_last():
    # max_in_flight = 1: a request pipelined behind another on its connection is read once
    # that one is answered, and by then that one has given its place back.
    fakes = await start_fakes("titan", tokens_per_second=2000)
    keys = {"serial": {"secret": ALICE, "routes": ["team"], "max_in_flight": 1}}
    crossbar = await start_crossbar(fakes, ROUTES, keys=keys)
    try:
        body = json.dumps({"model": MODEL, "max_tokens": 8, "messages": HELLO}).encode()

        def post(last: bool) -> bytes:
            head = (
                "POST /r/team/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {ALICE}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n" + ("Connection: close\r\n" if last else "")
            )
            return head.encode() + b"\r\n" + body

        client = Pipelined([post(False), post(False), post(True)])
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", crossbar.port.getHost().port)
        await connectProtocol(endpoint, client)
        received = await wait(client.closed, 30)
        assert re.findall(rb"HTTP/1\.1 (\d{3}) ", received) == [b"200", b"200", b"200"]
        assert crossbar.fakes["titan"].counters.requests["/v1/chat/completions"] == 3
    finally:
        await crossbar.stop()
