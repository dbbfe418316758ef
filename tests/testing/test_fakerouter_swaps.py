"""The fake router swaps models as llama-server's router does, on a fake clock: at most
`models_max` run, a load unloads the least recently used idle model (never a busy one), an
unloaded model's prompt cache is gone, requests for one model share its load, and a request that
meets a model being stopped may get the router's 500 proxy error."""

from __future__ import annotations

import json
from typing import Any

from crossbar.testing.fakerouter import PROXY_ERROR, FakeRouter
from crossbar.testing.fakestate import FakeConfig
from tests.support.memnet import Client, Net, _unchunk

LOAD, STOP = 2.0, 1.0  # seconds a load and a stop take


def router(net: Net, models: tuple[str, ...] = ("coder", "chat"), **knobs: Any) -> FakeRouter:
    # Each model writes 10 tokens a second: a 20-token answer keeps it busy for 2 s.
    configs = {name: FakeConfig(parallel=2, tokens_per_second=10) for name in models}
    knobs = {"load_delay": LOAD, "models_max": 1, **knobs}
    return FakeRouter(net.clock, configs, **knobs)


def send(net: Net, r: FakeRouter, method: str, path: str, body: Any = None) -> Client:
    client = net.client(r.factory)
    data = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: router\r\nContent-Length: {len(data)}\r\n"
    client.transport.write(head.encode() + b"Content-Type: application/json\r\n\r\n" + data)
    net.flush()
    return client


def chat(net: Net, r: FakeRouter, model: str, text: str = "hello", tokens: int = 20) -> Client:
    body = {"model": model, "messages": [{"role": "user", "content": text}],
            "max_tokens": tokens}  # fmt: skip
    return send(net, r, "POST", "/v1/chat/completions", body)


def answer(client: Client) -> Any:
    body = client.received.split(b"\r\n\r\n", 1)[1]
    if client.header(b"transfer-encoding") == b"chunked":
        body = _unchunk(body)
    try:
        return json.loads(body)
    except ValueError:
        return body


def events(r: FakeRouter) -> list[tuple[str, str]]:
    return [(what, model) for _, what, model in r.history]


def test_a_second_model_unloads_the_idle_first_and_its_cache_goes_with_it():
    net = Net()
    r = router(net)
    first = chat(net, r, "coder", "A long question about parsers and their tests.")
    net.run(LOAD + 3)
    assert first.status == 200 and r.status == {"coder": "loaded", "chat": "unloaded"}
    other = chat(net, r, "chat")
    net.run(STOP + LOAD + 3)
    assert other.status == 200 and r.status == {"coder": "unloaded", "chat": "loaded"}
    again = chat(net, r, "coder", "A long question about parsers and their tests.")
    net.run(LOAD + 3)
    assert answer(again)["timings"]["cache_n"] == 0  # loaded afresh: nothing cached
    assert events(r) == [("load", "coder"), ("evict", "coder"), ("load", "chat"),
                         ("evict", "chat"), ("load", "coder")]  # fmt: skip
    assert r.evictions == ["coder", "chat"]


def test_a_busy_model_is_never_unloaded_the_other_waits_for_its_answer_to_end():
    net = Net()
    r = router(net, loaded=("coder",))
    busy = chat(net, r, "coder", tokens=20)  # 2 s of writing
    waiting = chat(net, r, "chat")
    net.run(1.5)
    assert r.status["coder"] == "loaded" and waiting.status is None
    net.run(1.0)  # coder's answer ends: now it is idle, and unloaded for chat
    assert busy.status == 200 and "coder" in r.evictions
    net.run(LOAD + 3)
    assert waiting.status == 200 and r.status["chat"] == "loaded"


def test_requests_for_one_unloaded_model_share_its_load():
    net = Net()
    r = router(net, models_max=0)
    one, two = chat(net, r, "chat"), chat(net, r, "chat")
    net.run(LOAD + 3)
    assert (one.status, two.status, r.loads) == (200, 200, 1)


def test_the_least_recently_used_idle_model_is_the_one_unloaded():
    net = Net()
    r = router(net, models=("coder", "chat", "vision"), models_max=2)
    chat(net, r, "coder")
    net.run(LOAD + 3)
    chat(net, r, "chat")
    net.run(LOAD + 3)
    chat(net, r, "coder")  # coder is used again: chat is now the least recently used
    net.run(3)
    chat(net, r, "vision")
    net.run(STOP + LOAD + 3)
    assert r.evictions == ["chat"]
    assert r.status == {"coder": "loaded", "chat": "unloaded", "vision": "loaded"}


def test_the_load_api_unloads_the_idle_lru_or_says_the_limit_is_reached():
    net = Net()
    r = router(net, loaded=("coder",))
    loaded = send(net, r, "POST", "/models/load", {"model": "chat"})
    assert (loaded.status, answer(loaded)) == (200, {"success": True})
    net.run(STOP + LOAD + 1)
    assert r.status == {"coder": "unloaded", "chat": "loaded"}
    busy = chat(net, r, "chat", tokens=20)
    refused = send(net, r, "POST", "/models/load", {"model": "coder"})
    assert refused.status == 500
    assert answer(refused)["error"]["message"] == "model limit reached, try again later"
    net.run(3)
    assert busy.status == 200
    not_running = send(net, r, "POST", "/models/unload", {"model": "coder"})
    assert (not_running.status, answer(not_running)["error"]["message"]) == (
        400,
        "model is not running",
    )


def test_a_request_meeting_a_model_being_stopped_gets_the_proxy_error_or_waits():
    for swap_errors in (True, False):
        net = Net()
        r = router(net, loaded=("coder",), unload_delay=STOP, swap_errors=swap_errors)
        send(net, r, "POST", "/models/unload", {"model": "coder"})
        met = chat(net, r, "coder")
        net.run(STOP + LOAD + 3)
        if swap_errors:
            assert (met.status, answer(met)) == (500, PROXY_ERROR)
        else:
            assert met.status == 200 and r.status["coder"] == "loaded"


def test_the_routers_props_say_how_many_models_it_runs_at_once():
    net = Net()
    r = router(net, models_max=3, models=("coder", "chat", "vision", "embed"))
    props = answer(send(net, r, "GET", "/props"))
    assert (props["role"], props["max_instances"]) == ("router", 3)
