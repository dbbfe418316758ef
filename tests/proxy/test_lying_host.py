"""A host that lies about its numbers costs no more than the answer it lies in (issue 47, told
on the in-memory network with hosts that answer whatever JSON a story gives them).

Every token count a host reports is an integer from 0 to 2^31 - 1, the cached part no larger
than the prompt, every time finite: an answer that breaks that keeps only what crossbar saw
itself, is counted per host and reason, and is never stored, charged or learned from. Admin
answers are strict JSON, and no host-chosen byte reaches a log line raw."""

from __future__ import annotations

import json
from typing import Any

import pytest
from twisted.logger import Logger, globalLogPublisher

from crossbar.app.logs import ClassicText, log_request
from crossbar.records import UsageRow
from crossbar.testing.fakestate import FakeConfig
from tests.support.memnet import (
    CHAT_PATH,
    MODEL,
    Client,
    Crossbar,
    Host,
    Net,
    _unchunk,
    chat,
    start,
)
from tests.support.routes import CONVO

SECRET = "sk-lying-host-0123456789"
SOLO = {"convo": {"hosts": ["titan"], "default_model": MODEL}}
HONEST = {"prompt_tokens": 300, "completion_tokens": 20}


class Logged:
    """The log events while a story runs, and each as twistd's text observer writes it."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def __enter__(self) -> Logged:
        globalLogPublisher.addObserver(self)
        return self

    def __exit__(self, *exc: object) -> None:
        globalLogPublisher.removeObserver(self)

    def failures(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("log_failure") is not None]

    def text(self) -> str:
        write = ClassicText()
        return "".join(write(e) or "" for e in self.events)


def lying(crossbar: Crossbar, usage: dict[str, Any], timings: dict[str, Any] | None = None) -> None:
    """Every host answers every request with a whole chat completion reporting `usage` (and
    llama.cpp's `timings`, when given)."""
    answer: dict[str, Any] = {"id": "c1", "object": "chat.completion", "usage": usage}
    answer["choices"] = [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]
    if timings is not None:
        answer["timings"] = timings
    body = json.dumps(answer).encode()
    for name in ("titan", "atlas"):
        crossbar.net.on_request[name] = lambda host: host.answer(body)


def streaming(crossbar: Crossbar, last: dict[str, Any]) -> None:
    """Every host streams three token events, then a last one carrying `last`, then [DONE]."""

    def answer(host: Host) -> None:
        host.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        events = [{"id": "c1", "choices": [{"index": 0, "delta": {"content": f"t{i}"}}]}
                  for i in range(3)]  # fmt: skip
        events.append({"id": "c1", "choices": [], **last})
        for event in [*(json.dumps(e).encode() for e in events), b"[DONE]"]:
            data = b"data: " + event + b"\n\n"
            host.transport.write(b"%x\r\n%s\r\n" % (len(data), data))
        host.transport.write(b"0\r\n\r\n")

    for name in ("titan", "atlas"):
        crossbar.net.on_request[name] = answer


def strict(text: str | bytes) -> Any:
    """JSON as a strict parser reads it: Infinity and NaN are errors."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def admin_text(crossbar: Crossbar, path: str) -> tuple[int, bytes]:
    client = crossbar.net.client(crossbar.sites.admin, peer="127.0.0.1")
    client.transport.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    crossbar.net.flush()
    assert client.status is not None, client.received
    body = client.received.split(b"\r\n\r\n", 1)[1]
    if client.header(b"transfer-encoding") == b"chunked":
        body = _unchunk(body)
    return client.status, body


def metric(crossbar: Crossbar, line_start: str) -> float | None:
    status, body = admin_text(crossbar, "/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


def whole(client: Client) -> Any:
    assert client.status == 200, client.received[-300:]
    return json.loads(client.received.split(b"\r\n\r\n", 1)[1])


# -- counts past any column or float -----------------------------------------------------------


def test_an_answer_reporting_2_to_the_63_tokens_is_served_and_its_counts_are_dropped():
    crossbar = start(CONVO)
    lying(crossbar, {"prompt_tokens": 2**63, "completion_tokens": 4})
    with Logged() as logged:
        answer = whole(crossbar.post(CHAT_PATH, chat("a big liar")))
    assert answer["usage"]["prompt_tokens"] == 2**63  # the client gets the host's answer as sent
    row = crossbar.store.usage[-1]
    assert (row.status, row.prompt_tokens, row.completion_tokens) == (200, 0, 0)
    assert logged.failures() == []
    refused = 'crossbar_host_reports_refused_total{host="%s",reason="tokens_out_of_range"}'
    assert (metric(crossbar, refused % "titan") or 0) + (metric(crossbar, refused % "atlas") or 0)
    assert "reported token counts or times out of bounds" in logged.text()
    # Nothing is left waiting: the store stays well, and an honest answer after is recorded.
    lying(crossbar, HONEST)
    whole(crossbar.post(CHAT_PATH, chat("an honest turn")))
    assert crossbar.store.usage[-1].prompt_tokens == 300
    assert crossbar.admin("GET", "/api/status")[1]["status"] == "ok"


@pytest.mark.parametrize("where", ["predicted_n", "prompt_n", "completion_tokens"])
def test_a_count_past_a_float_never_cuts_a_stream(where):
    crossbar = start(CONVO)
    huge = 10**400  # valid JSON; float() of it raises OverflowError
    if where == "completion_tokens":
        last = {"usage": {"prompt_tokens": 5, "completion_tokens": huge}}
    else:
        last = {"timings": {"cache_n": 0, "prompt_n": 5, "predicted_n": 3, where: huge}}
    streaming(crossbar, last)
    body = json.dumps({"model": MODEL, "stream": True, "messages": [
        {"role": "user", "content": "stream to me"}]}).encode()  # fmt: skip
    with Logged() as logged:
        client = crossbar.post(CHAT_PATH, body)
    assert client.status == 200
    assert client.received.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")  # the whole stream
    assert logged.failures() == []
    row = crossbar.store.usage[-1]
    assert (row.prompt_tokens, row.completion_tokens, row.error) == (0, 4, "")  # events seen


# -- counts that would refund a key ------------------------------------------------------------


def test_negative_counts_never_refund_a_keys_budget():
    # Round 5: five answers of -100,000 tokens took a 1,000-a-day key to -1,000,000 used, and
    # ten honest answers of 320 tokens were then all admitted.
    routes = {"convo": {**SOLO["convo"], "auth": "keys"}}
    keys = {"team": {"secret": SECRET, "routes": ["convo"], "tokens_per_day": 1000}}
    crossbar = start(routes, hosts=("titan",), keys=keys)
    auth = {"Authorization": f"Bearer {SECRET}"}
    small = json.dumps(
        {"model": MODEL, "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    lying(crossbar, {"prompt_tokens": -100_000, "completion_tokens": -100_000})
    for _ in range(5):
        assert crossbar.post(CHAT_PATH, small, **auth).status == 200
    used = crossbar.admin("GET", "/api/keys/team")[1]["used"]["tokens_today"]
    assert used > 0  # each charged its estimate: never less than nothing
    lying(crossbar, {"prompt_tokens": 300, "completion_tokens": 20})
    statuses = [crossbar.post(CHAT_PATH, small, **auth).status for _ in range(10)]
    assert statuses.count(429) > 0, statuses
    assert 0 < statuses.count(200) <= (1000 - used) / 320 + 1, (statuses, used)


# -- times that would make a rate infinite ------------------------------------------------------


def test_a_subnormal_time_never_makes_a_rate_infinite_and_admin_answers_stay_strict_json():
    crossbar = start(SOLO, hosts=("titan",))
    timings = {"cache_n": 0, "prompt_n": 200, "prompt_ms": 1e-320,
               "predicted_n": 20, "predicted_ms": 1e-320}  # fmt: skip
    lying(crossbar, {"prompt_tokens": 200, "completion_tokens": 20}, timings)
    for i in range(3):
        whole(crossbar.post(CHAT_PATH, chat(f"turn {i}")))
    status, body = admin_text(crossbar, "/api/hosts")
    assert status == 200
    hosts = strict(body)  # round 5: "prefill_tokens_per_second": Infinity
    assert "Infinity" not in body.decode()
    assert hosts  # the host is there, with whatever rates it may honestly show


# -- names a host chose ------------------------------------------------------------------------

FORGED = "m\r\n2026-12-04T00:00:00+0000 [crossbar.request#info] FORGED\x1b[31mRED"


def test_a_discovered_model_id_with_control_characters_is_refused_and_never_logged_raw():
    net = Net()
    net.serve_router("titan", {FORGED: FakeConfig(), "coder": FakeConfig()}, models_max=2)
    routes = {"convo": {"hosts": ["titan"]}}
    with Logged() as logged:
        crossbar = start(routes, net=net, host_tables={"titan": {"models": "discover"}})
        crossbar.parts.hosts.probe_all()
        net.run(0.5)
        assert [m.name for m in crossbar.parts.hosts.models("titan")] == ["coder"]
        body = {"model": FORGED, "messages": [{"role": "user", "content": "hi"}]}
        client = crossbar.post(CHAT_PATH, json.dumps(body).encode())
    assert client.status == 404  # a model the route does not serve
    text = logged.text()
    assert "refuses (it holds control characters)" in text
    # Not one line of the log starts anywhere but where twistd starts one, and no escape
    # sequence reaches the terminal.
    assert "\r" not in text and "\x1b" not in text
    assert all(line[:1] in ("2", "\t") for line in text.splitlines() if line), text
    assert "FORGED" in text  # said, escaped
    _, metrics = admin_text(crossbar, "/metrics")
    assert b"\r" not in metrics and b"\x1b" not in metrics


def test_every_line_the_text_observer_writes_escapes_text_from_outside():
    # llhttp refuses control bytes in a request target and an unserved model is never
    # recorded, so what reached a line raw was a host's name for its model: the request line
    # escapes every field, and every other line's control characters are escaped too.
    raw = "x\r\n2026-12-04T00:00:00+0000 [crossbar.request#info] FORGED\x1b[31m\u2028"
    row = UsageRow(0.0, raw, "fp", raw, raw, "/" + raw, 200, False, key=raw)
    with Logged() as logged:
        log_request(row)
        Logger(namespace="crossbar.hosts").warn("host {host} says {what}", host="h", what=raw)
    text = logged.text()
    # Two events, a line each: a line break of the warning's own stays, indented as twistd
    # indents a traceback's, so it starts no line of its own.
    assert len([line for line in text.splitlines() if not line.startswith("\t")]) == 2, text
    assert "\r" not in text and "\x1b" not in text and "\u2028" not in text
    assert text.count("FORGED") == 6  # route, path, host, model, key; the warning: escaped
