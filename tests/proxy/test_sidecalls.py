"""Side calls reach the host their chat is on; queue = false never waits; the guard counts."""

import json

import pytest_twisted
from twisted.internet.defer import Deferred

from tests.support.harness import MODEL, start_fakes, until, wait

TWO = ["titan", "atlas"]


async def post(crossbar, route, path, body):
    response = await wait(
        crossbar.client().post(crossbar.url(route, path), data=json.dumps(body).encode())
    )
    return response, await response.content()


def host_of(response):
    return response.headers.getRawHeaders("X-Crossbar-Host")[0]


class FirstChunk:
    """Reads a streamed body; `first` fires with the first chunk's completion id."""

    def __init__(self):
        self.first = Deferred()
        self.done = Deferred()
        self.data = b""

    def makeConnection(self, transport):
        pass

    def dataReceived(self, data):
        self.data += data
        if not self.first.called and b"data: {" in self.data:
            line = self.data.split(b"data: ", 1)[1].split(b"\n", 1)[0]
            self.first.callback(json.loads(line)["id"])

    def connectionLost(self, reason):
        self.done.callback(None)


@pytest_twisted.ensureDeferred
async def test_on_a_route_affinity_route_chat_slots_and_control_share_one_host(launch):
    fakes = await start_fakes(*TWO)
    crossbar = await launch(fakes, {"ide": {"hosts": TWO, "affinity": "route"}})
    hosts = set()
    for n in range(3):
        chat = {"model": MODEL, "messages": [{"role": "user", "content": f"task {n}"}]}
        response, raw = await post(crossbar, "ide", "/v1/chat/completions", chat)
        hosts.add(host_of(response))
    completion_id = json.loads(raw)["id"]
    slots = await wait(crossbar.client().get(crossbar.url("ide", "/slots")))
    await slots.content()
    control, _ = await post(
        crossbar, "ide", "/v1/chat/completions/control", {"id": completion_id, "action": "x"}
    )
    hosts |= {host_of(slots), host_of(control)}
    assert len(hosts) == 1
    (home,) = hosts
    assert fakes[home].counters.requests["/slots"] == 1
    assert fakes[home].counters.requests["/v1/chat/completions/control"] == 1
    rows = await crossbar.parts.store.list_leases()
    assert {(r.key.fp, r.host) for r in rows if r.key.route == "ide"} == {("", home)}


@pytest_twisted.ensureDeferred
async def test_a_control_call_finds_a_running_completion_when_the_route_lease_is_elsewhere(launch):
    fakes = await start_fakes(*TWO, tokens_per_second=20)
    crossbar = await launch(fakes, {"convo": {"hosts": TWO}})
    stream = await wait(
        crossbar.client().post(
            crossbar.url("convo", "/v1/chat/completions"),
            data=json.dumps(
                {
                    "model": MODEL,
                    "stream": True,
                    "max_tokens": 40,
                    "messages": [{"role": "user", "content": "think for a while"}],
                }
            ).encode(),
        )
    )
    reader = FirstChunk()
    stream.deliverBody(reader)
    completion_id = await wait(reader.first)
    chat_host = host_of(stream)
    # A call without a conversation leases the route itself: the chooser puts it elsewhere.
    slots = await wait(crossbar.client().get(crossbar.url("convo", "/slots")))
    await slots.content()
    assert host_of(slots) != chat_host
    response, raw = await post(
        crossbar,
        "convo",
        "/v1/chat/completions/control",
        {"id": completion_id, "action": "reasoning_end"},
    )
    assert host_of(response) == chat_host
    assert json.loads(raw) == {"success": True}
    await wait(reader.done, 20)


@pytest_twisted.ensureDeferred
async def test_queue_false_forwards_at_once_while_a_queueing_route_waits(launch):
    fakes = await start_fakes("titan", parallel=1, tokens_per_second=20)
    routes = {"free": {"hosts": ["titan"], "queue": False}, "queued": {"hosts": ["titan"]}}
    crossbar = await launch(fakes, routes, parallel=1)
    limiter, fake = crossbar.parts.limiter, fakes["titan"]

    def chat(route, n):
        body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": n}]}
        return crossbar.client().post(
            crossbar.url(route, "/v1/chat/completions"), data=json.dumps(body).encode()
        )

    first = chat("free", "one")
    await until(lambda: fake.counters.in_flight == 1)
    second = chat("free", "two")
    await until(lambda: fake.counters.in_flight == 2)  # forwarded: the fake queues it
    assert fake.counters.queued == 1
    assert limiter.in_flight("titan", MODEL) == 2  # tracked requests still count as load
    third = chat("queued", "three")
    await until(lambda: limiter.queued("titan", MODEL) == 1)  # held by crossbar: host full
    assert fake.counters.requests["/v1/chat/completions"] == 2
    for d in (first, second, third):
        response = await wait(d, 20)
        assert response.code == 200
        await response.content()
    assert limiter.in_flight("titan", MODEL) == 0


@pytest_twisted.ensureDeferred
async def test_the_context_guard_counts_what_is_not_far_under_and_refuses_only_on_the_count(launch):
    fakes = await start_fakes("titan", ctx=1000)
    crossbar = await launch(fakes, {"convo": {"hosts": ["titan"]}}, ctx=1000)
    fake = fakes["titan"]
    inference = "/v1/chat/completions"
    counting = "/v1/chat/completions/input_tokens"

    def words(n):
        return [{"role": "user", "content": " ".join(["word"] * n)}]

    def sized(target):
        n = target
        while len(fake.chat_prompt(words(n))) > target:
            n -= 1
        return words(n)

    far, raw = await post(crossbar, "convo", inference, {"model": MODEL, "messages": words(20_000)})
    error = json.loads(raw)["error"]
    assert far.code == 400 and error["code"] == "context_length_exceeded"
    assert "1000" in error["message"]
    assert fake.counters.requests[inference] == 0
    assert fake.counters.requests[counting] == 1  # even far over, refused on a count

    under = sized(990)
    ok, _ = await post(
        crossbar, "convo", inference, {"model": MODEL, "messages": under, "max_tokens": 5}
    )
    assert ok.code == 200
    assert fake.counters.requests[counting] == 2  # near the limit: counted exactly
    assert fake.counters.requests[inference] == 1

    over = sized(1000)
    refused, raw = await post(
        crossbar, "convo", inference, {"model": MODEL, "messages": over, "max_tokens": 50}
    )
    assert refused.code == 400
    assert json.loads(raw)["error"]["code"] == "context_length_exceeded"
    assert fake.counters.requests[counting] == 3
    assert fake.counters.requests[inference] == 1  # never sent upstream


@pytest_twisted.ensureDeferred
async def test_a_responses_chain_stays_on_one_host_for_five_turns(launch):
    # llama-server refuses previous_response_id; an upstream that keeps responses is modelled.
    fakes = await start_fakes(*TWO, keep_responses=True)
    crossbar = await launch(fakes, {"convo": {"hosts": TWO}})
    previous, homes, cached = None, set(), []
    for n in range(5):
        body = {"model": MODEL, "input": f"turn {n}: tell me more about parsers"}
        if previous:
            body["previous_response_id"] = previous
        response, raw = await post(crossbar, "convo", "/v1/responses", body)
        assert response.code == 200
        reply = json.loads(raw)
        previous = reply["id"]
        homes.add(host_of(response))
        cached.append(reply["usage"]["input_tokens_details"]["cached_tokens"])
        # Someone else's conversation in between: the chooser would alternate hosts.
        await post(
            crossbar,
            "convo",
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": f"other {n}"}]},
        )
    assert len(homes) == 1
    assert all(c > 0 for c in cached[1:]), cached
