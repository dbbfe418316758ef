"""Whatever a client sends, crossbar answers it in the client's dialect without a 5xx of its own,
logs no traceback, and gives every slot back (stories and a hypothesis search, in memory)."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.logger import globalLogPublisher

from tests.support.memnet import MODEL, start
from tests.support.routes import CONVO

ROUTES = CONVO
PATHS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/completion",
    "/infill",
    "/v1/embeddings",
    "/v1/rerank",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/chat/completions/control",
    "/tokenize",
    "/apply-template",
    "/lora-adapters",
    "/slots/0",
]


class Failures:
    """Collects logged failures (tracebacks) while a test runs."""

    def __init__(self):
        self.seen = []

    def __call__(self, event):
        if event.get("log_failure") is not None:
            self.seen.append(event)

    def __enter__(self):
        globalLogPublisher.addObserver(self)
        return self

    def __exit__(self, *exc):
        globalLogPublisher.removeObserver(self)


def answered(crossbar, client) -> tuple[int, bytes]:
    assert client.status is not None, client.received[:200]
    return client.status, client.received.split(b"\r\n\r\n", 1)[1]


def crossbar_with_hosts():
    crossbar = start(ROUTES)
    for name in ("titan", "atlas"):
        crossbar.net.on_request[name] = lambda host: host.answer(b"{}")
    return crossbar


def check_no_crossbar_failure(crossbar, client, path):
    status, body = answered(crossbar, client)
    made_here = client.header(b"X-Crossbar-Host") is None
    if made_here:
        assert status < 500, body
        parsed = json.loads(body)
        if path.startswith("/v1/messages"):
            assert parsed["type"] == "error" and parsed["error"]["type"]
        else:
            assert parsed["error"]["type"]
    for host in ("titan", "atlas"):
        assert crossbar.parts.limiter.in_flight(host, MODEL) == 0


BAD_BODIES = [
    b'{"messages": 5}',
    b'{"messages": 1e308}',
    b'{"messages": [5, null, "x", {"role": 7, "content": {"a": [1]}}]}',
    b'{"model": 5, "messages": []}',
    b'{"model": "' + MODEL.encode() + b'", "max_tokens": "many", "n_predict": [1]}',
    b'{"system": {"x": 1}, "messages": [{"content": [{"type": "image", "source": 5}]}]}',
    b'{"input": {"deep": [[[[]]]]}, "instructions": 5, "previous_response_id": 7}',
    b'{"prompt": ["a", 1, null], "input_prefix": 3, "prompt_cache_key": 9}',
    b'{"tools": {"a": 1e308}, "messages": "hi"}',
    b"[" * 200_000 + b"]" * 200_000,
    b'{"a": ' * 5000 + b"1" + b"}" * 5000,
    b'{"messages": [' + b"[" * 900 + b"]" * 900 + b"]}",
    b"\xff\xfe not json",
    b'"just a string"',
]


@pytest.mark.parametrize("body", BAD_BODIES, ids=range(len(BAD_BODIES)))
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/completion"])
def test_a_malformed_body_is_a_4xx_in_the_callers_dialect(body, path):
    crossbar = crossbar_with_hosts()
    with Failures() as failures:
        client = crossbar.post("/r/convo" + path, body)
    check_no_crossbar_failure(crossbar, client, path)
    assert failures.seen == []


@pytest.mark.parametrize(
    "header",
    [
        ("X-Crossbar-Conversation", "caf\xe9 \xff\xfe"),
        ("X-Session-Id", "\x00\x01"),
        ("Authorization", "Bearer \xff"),
        ("X-Crossbar-Route", "\xff\xfe"),
        ("X-Api-Key", "\xe9"),
    ],
)
def test_header_bytes_that_are_not_utf8_are_taken_or_refused_cleanly(header):
    crossbar = crossbar_with_hosts()
    body = b'{"messages": [{"role": "user", "content": "hi"}]}'
    with Failures() as failures:
        client = crossbar.send("POST", "/r/convo/v1/chat/completions", body, {header[0]: header[1]})
    check_no_crossbar_failure(crossbar, client, "/v1/chat/completions")
    assert failures.seen == []


KEYS = [
    *("model", "messages", "role", "content", "prompt", "input", "system", "type", "text"),
    *("id", "max_tokens", "n_predict", "stream", "tools", "instructions", "input_prefix"),
    *("previous_response_id", "prompt_cache_key"),
]
JSON = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(KEYS),
            children,
            max_size=5,
        )
    ),
    max_leaves=25,
)


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    path=st.sampled_from(PATHS),
    body=JSON,
    method=st.sampled_from(["POST", "POST", "GET", "OPTIONS", "DELETE"]),
    header=st.binary(max_size=12),
)
def test_any_json_and_any_header_bytes_leave_no_5xx_no_traceback_and_no_held_slot(
    path, body, method, header
):
    crossbar = crossbar_with_hosts()
    raw = json.dumps(body, allow_nan=True).encode()
    value = header.replace(b"\r", b"").replace(b"\n", b"").decode("latin-1")
    with Failures() as failures:
        client = crossbar.send(
            method, "/r/convo" + path, raw, {"X-Crossbar-Conversation": value.strip() or "x"}
        )
    check_no_crossbar_failure(crossbar, client, path)
    assert failures.seen == []
