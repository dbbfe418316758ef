"""A route that cannot serve a request falls back to the routes it names, before the first byte
and only then: a big model's route whose box is down or saturated hands its turns to a smaller
model's route beside it, says so (`X-Crossbar-Fallback`, the usage row, the metric), and keeps
the conversation's lease at home, so its next turn goes home once home can serve it. Client
errors, a key's limits and a pin never fall back, and a key never falls back outside its scope.
Told through real sockets, crossbar's own site in front of fake llama-servers."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.threads import deferToThread
from twisted.web.client import ResponseFailed

from crossbar.config import ConfigError
from crossbar.config.values import parse_config
from crossbar.records import UsageRow
from crossbar.testing.fakellama import FakeLlama
from tests.support.harness import MODEL, Crossbar, start_crossbar, until, wait
from tests.support.memnet import CHAT_PATH
from tests.support.memnet import start as on_memnet

BIG, SMALL = MODEL, "small-8b"
ANN, BEN = "sk-ann-0123456789ab", "sk-ben-ba9876543210"


async def fleet() -> dict[str, FakeLlama]:
    """`titan` serves the big model, `atlas` the small one (another box)."""
    fakes = {}
    for name, model in (("titan", BIG), ("atlas", SMALL)):
        fake = FakeLlama(reactor, models=[model], tokens_per_second=2000)
        await fake.start()
        fakes[name] = fake
    return fakes


def hosts_of(fakes: dict[str, FakeLlama]) -> dict[str, Any]:
    models = {"titan": [BIG], "atlas": [SMALL]}
    return {
        name: {"url": f.url, "models": models[name], "parallel": 1} for name, f in fakes.items()
    }


def routes(**main: Any) -> dict[str, Any]:
    return {
        "main": {"hosts": ["titan"], "default_model": BIG, "fallbacks": ["spare"], **main},
        "spare": {"hosts": ["atlas"], "default_model": SMALL},
    }


async def start(main: dict[str, Any] | None = None, **kwargs: Any) -> tuple[Crossbar, list]:
    fakes = await fleet()
    crossbar = await start_crossbar(
        fakes, kwargs.pop("routes", None) or routes(**(main or {})), hosts=hosts_of(fakes), **kwargs
    )
    rows: list[UsageRow] = []
    crossbar.parts.usage.observers.append(rows.append)
    return crossbar, rows


def chat(text: str, **extra: Any) -> bytes:
    body = {"model": BIG, "messages": [{"role": "user", "content": text}], **extra}
    return json.dumps(body).encode()


async def post(crossbar: Crossbar, body: bytes, route: str = "main", **headers: str) -> Any:
    """POST a chat body; the response with `body`, all of it that came (a cut stream's part)."""
    response = await wait(
        crossbar.client().post(
            crossbar.url(route, "/v1/chat/completions"),
            data=body,
            headers={"Content-Type": "application/json", **headers},
        ),
        30,
    )
    parts: list[bytes] = []
    try:
        await treq.collect(response, parts.append)
    except ResponseFailed:
        pass  # a stream cut short: what came is kept
    response.body = b"".join(parts)
    return response


def header(response: Any, name: str) -> str | None:
    values = response.headers.getRawHeaders(name)
    return values[-1] if values else None


def fallbacks_metric(crossbar: Crossbar) -> dict[tuple[str, str, str], float]:
    out = {}
    for line in crossbar.parts.metrics.render().decode().splitlines():
        if line.startswith("crossbar_fallbacks_total{"):
            labels = dict(
                part.split("=", 1)
                for part in line[line.index("{") + 1 : line.index("}")].split(",")
            )
            key = tuple(labels[k].strip('"') for k in ("route", "to", "reason"))
            out[key] = float(line.rsplit(" ", 1)[1])
    return out


async def hold_the_only_slot(crossbar: Crossbar) -> Any:
    """A request that holds titan's one slot until the test lets it go."""
    crossbar.fakes["titan"].faults.hang = True
    held = crossbar.client().post(
        crossbar.url("main", "/v1/chat/completions"),
        data=chat("a long job"),
        headers={"Content-Type": "application/json"},
    )
    await until(lambda: crossbar.parts.limiter.in_flight("titan", BIG) == 1)
    return held


@pytest_twisted.ensureDeferred
async def test_a_full_queue_falls_back_to_the_next_route_and_says_so():
    crossbar, rows = await start({"max_queued": 0})
    try:
        held = await hold_the_only_slot(crossbar)
        response = await post(crossbar, chat("refactor the parser"))
        assert response.code == 200
        assert header(response, "X-Crossbar-Fallback") == "spare"
        assert header(response, "X-Crossbar-Host") == "atlas"
        assert json.loads(response.body)["model"] == SMALL  # what served it
        row = rows[-1]
        assert (row.route, row.fallback_from, row.fallback_reason) == (
            "spare",
            "main",
            "queue_full",
        )
        assert (row.host, row.model, row.status) == ("atlas", SMALL, 200)
        assert fallbacks_metric(crossbar) == {("main", "spare", "queue_full"): 1.0}
        held.cancel()
        held.addErrback(lambda _: None)
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_route_whose_host_refuses_falls_back_and_its_next_turn_goes_home_reused():
    crossbar, rows = await start()
    titan = crossbar.fakes["titan"]
    try:
        first = await post(crossbar, chat("hello"))  # the conversation's lease: main on titan
        assert (
            header(first, "X-Crossbar-Lease") == "new"
            and header(first, "X-Crossbar-Host") == "titan"
        )
        titan.faults.refuse = True
        await titan.settle()
        down = await post(crossbar, chat("hello"))
        assert down.code == 200
        assert header(down, "X-Crossbar-Fallback") == "spare"
        assert header(down, "X-Crossbar-Host") == "atlas"
        assert header(down, "X-Crossbar-Lease") == "new"  # the conversation's lease on spare
        assert rows[-1].fallback_reason == "host_refused"
        again = await post(crossbar, chat("hello"))
        assert header(again, "X-Crossbar-Lease") == "reused"  # warm on spare too
        assert header(again, "X-Crossbar-Host") == "atlas"
        titan.faults.refuse = False
        await titan.settle()
        home = await post(crossbar, chat("hello"))
        assert home.code == 200 and header(home, "X-Crossbar-Fallback") is None
        assert header(home, "X-Crossbar-Host") == "titan"
        assert header(home, "X-Crossbar-Lease") == "reused"  # its lease at home was kept
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("status", [429, 503])
async def test_a_host_saying_not_now_before_any_byte_falls_back(status):
    crossbar, rows = await start()
    try:
        crossbar.fakes["titan"].faults.busy = status
        response = await post(crossbar, chat("hello"))
        assert response.code == 200
        assert header(response, "X-Crossbar-Fallback") == "spare"
        assert rows[-1].fallback_reason == "host_busy"
        assert crossbar.parts.hosts.healthy("titan")  # a busy host is no down host
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_host_saying_not_now_with_no_fallback_able_is_answered_as_the_host_said():
    crossbar, _ = await start()
    try:
        crossbar.fakes["titan"].faults.busy = 429
        crossbar.fakes["atlas"].faults.refuse = True
        await crossbar.fakes["atlas"].settle()
        response = await post(crossbar, chat("hello"))
        assert response.code == 429 and header(response, "X-Crossbar-Fallback") is None
        assert "host titan is busy" in json.loads(response.body)["error"]["message"]
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_stream_never_falls_back_after_its_first_byte():
    crossbar, rows = await start()
    try:
        crossbar.fakes["titan"].faults.drop_after_chunks = 2
        response = await post(crossbar, chat("stream it", stream=True))
        assert response.code == 200 and header(response, "X-Crossbar-Fallback") is None
        assert b"data:" in response.body
        assert rows[-1].route == "main" and rows[-1].error
        assert (
            crossbar.fakes["atlas"].counters.requests["/v1/chat/completions"] == 0
        )  # nothing went to spare
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_client_errors_key_limits_and_a_downed_pin_never_fall_back():
    keys = {"ann": {"secret": ANN, "routes": ["main", "spare"], "rpm": 1}}
    crossbar, _ = await start(keys=keys, server={"unhealthy_after": 1})
    titan = crossbar.fakes["titan"]
    try:
        bad = await post(crossbar, b'{"model": 1, "messages": []}')
        assert bad.code == 400 and header(bad, "X-Crossbar-Fallback") is None
        auth = {"Authorization": f"Bearer {ANN}"}
        assert (await post(crossbar, chat("one"), **auth)).code == 200
        limited = await post(crossbar, chat("two"), **auth)  # over the key's rpm
        assert limited.code == 429 and header(limited, "X-Crossbar-Fallback") is None
        await crossbar.pin("main", "titan")
        titan.faults.refuse = True
        await titan.settle()
        refused = await post(crossbar, chat("three"))  # the pinned host refuses: 502
        assert refused.code == 502 and header(refused, "X-Crossbar-Fallback") is None
        await wait(crossbar.parts.hosts.probe_all())  # the probes see it down
        assert not crossbar.parts.hosts.healthy("titan")
        pinned = await post(crossbar, chat("four"))  # known down: 503 naming the pin
        assert pinned.code == 503 and header(pinned, "X-Crossbar-Fallback") is None
        assert "pinned" in json.loads(pinned.body)["error"]["message"]
        assert crossbar.fakes["atlas"].counters.requests["/v1/chat/completions"] == 0
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_key_falls_back_only_to_routes_it_covers():
    shared = {**routes(max_queued=0), "spare": {**routes()["spare"], "auth": "keys"}}
    keys = {
        "ann": {"secret": ANN, "routes": ["main"]},
        "ben": {"secret": BEN, "routes": ["main", "spare"]},
    }
    crossbar, _ = await start(routes=shared, keys=keys)
    try:
        held = await hold_the_only_slot(crossbar)
        ann = await post(crossbar, chat("ann's turn"), Authorization=f"Bearer {ANN}")
        assert ann.code == 429 and header(ann, "X-Crossbar-Fallback") is None
        ben = await post(crossbar, chat("ben's turn"), Authorization=f"Bearer {BEN}")
        assert ben.code == 200 and header(ben, "X-Crossbar-Fallback") == "spare"
        held.cancel()
        held.addErrback(lambda _: None)
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_the_openai_client_reads_which_route_served_it():
    crossbar, _ = await start()
    crossbar.fakes["titan"].faults.refuse = True
    await crossbar.fakes["titan"].settle()
    try:

        def ask() -> Any:
            client = openai.OpenAI(base_url=crossbar.url("main", "/v1"), api_key="x", max_retries=0)
            messages = [{"role": "user", "content": "hello"}]
            return client.chat.completions.with_raw_response.create(model=BIG, messages=messages)

        raw = await wait(deferToThread(ask), 30)
        assert raw.headers["x-crossbar-fallback"] == "spare"
        assert raw.parse().model == SMALL
    finally:
        await crossbar.stop()


# -- what crossbar check refuses


def config_with(main: dict[str, Any], spare: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "server": {"db": ":memory:"},
        "hosts": {"titan": {"url": "http://titan:8080", "models": [BIG]}},
        "routes": {
            "main": {"hosts": ["titan"], **main},
            "spare": {"hosts": ["titan"], **(spare or {})},
        },
    }


@pytest.mark.parametrize(
    ("main", "spare", "said"),
    [
        ({"fallbacks": ["nowhere"]}, None, 'routes.main.fallbacks: unknown route "nowhere"'),
        (
            {"fallbacks": ["spare"]},
            {"fallbacks": ["main"]},
            "a loop of fallbacks (main -> spare -> main)",
        ),
        ({"fallbacks": ["main"]}, None, "a loop of fallbacks (main -> main)"),
        ({"fallback_after": "5s"}, None, "routes.main.fallback_after: needs fallbacks"),
    ],
    ids=["an unknown route", "a loop", "itself", "a wait with nowhere to go"],
)
def test_crossbar_check_refuses_fallbacks_it_cannot_follow(main, spare, said):
    with pytest.raises(ConfigError) as refused:
        parse_config(config_with(main, spare))
    assert any(said in line for line in refused.value.errors), refused.value.errors


@pytest_twisted.ensureDeferred
async def test_a_new_conversation_with_no_host_to_go_to_falls_back():
    crossbar, rows = await start()
    try:
        await crossbar.parts.hosts.drain("titan")  # it takes no new conversation
        response = await post(crossbar, chat("a new conversation"))
        assert response.code == 200 and header(response, "X-Crossbar-Fallback") == "spare"
        assert rows[-1].fallback_reason == "no_host"
    finally:
        await crossbar.stop()


def test_a_wait_past_fallback_after_gives_its_place_back_and_falls_back():
    convo = {
        "hosts": ["titan"],
        "default_model": BIG,
        "fallbacks": ["spare"],
        "fallback_after": "5s",
    }
    spare = {"hosts": ["atlas"], "default_model": BIG}
    crossbar = on_memnet({"convo": convo, "spare": spare}, parallel=1)
    net, limiter = crossbar.net, crossbar.parts.limiter
    net.on_request["atlas"] = lambda host: host.answer(b'{"id": "from-spare"}')
    holder = crossbar.post(CHAT_PATH, chat("a long job"))  # titan never answers it
    waiter = crossbar.post(CHAT_PATH, chat("the next turn"))
    assert limiter.queued("titan", BIG) == 1 and waiter.status is None
    net.run(4.9)
    assert waiter.status is None  # still within fallback_after: it waits at home
    net.run(0.1)
    assert waiter.status == 200 and waiter.header(b"X-Crossbar-Fallback") == b"spare"
    assert b"from-spare" in waiter.received
    assert limiter.queued("titan", BIG) == 0  # its place at home was given back
    assert holder.status is None
    (row,) = [r for r in crossbar.store.usage if r.fallback_from]
    assert (row.route, row.fallback_reason, row.host) == ("spare", "waited", "atlas")
