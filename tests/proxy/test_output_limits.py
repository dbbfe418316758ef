"""A route may give requests that set no output limit a default, and cap every one: an empty
conversation (`{"messages": []}`) no longer runs to the end of the context. Off by default;
each dialect's own field."""

import json

import pytest

from crossbar.wire import limit_output
from crossbar.wire.dialects import ANTHROPIC, LLAMA_COMPLETION, OPENAI_CHAT, RESPONSES
from tests.support.memnet import start

ROUTES = {
    "capped": {"hosts": ["titan"], "max_tokens_default": 256, "max_tokens_cap": 1024},
    "open": {"hosts": ["titan"]},
}


def sent(crossbar, path: str, body: dict) -> dict:
    """The body the host got for `body` posted to `path`."""
    net = crossbar.net
    got = []

    def answer(host):
        got.append(json.loads(host.received.split(b"\r\n\r\n", 1)[1]))
        host.answer(b"{}")

    net.on_request["titan"] = answer
    client = crossbar.post(path, json.dumps({"model": "qwen-coder", **body}).encode())
    assert client.status == 200, client.received
    for host in net.connections.pop("titan", []):
        host.transport.loseConnection()
    net.flush()
    return got[0]


def test_an_empty_conversation_gets_the_routes_default_and_others_their_own_limit_capped():
    crossbar = start(ROUTES, hosts=("titan",))
    chat = "/r/capped/v1/chat/completions"
    assert sent(crossbar, chat, {"messages": []})["max_tokens"] == 256
    assert sent(crossbar, chat, {"messages": [], "max_tokens": 100})["max_tokens"] == 100
    assert sent(crossbar, chat, {"messages": [], "max_tokens": 32000})["max_tokens"] == 1024
    # A route without the keys passes every body through as it came.
    assert "max_tokens" not in sent(crossbar, "/r/open/v1/chat/completions", {"messages": []})


@pytest.mark.parametrize(
    ("dialect", "body", "expected"),
    [
        (OPENAI_CHAT, {}, {"max_tokens": 256}),
        (OPENAI_CHAT, {"max_completion_tokens": 4000}, {"max_completion_tokens": 1024}),
        (OPENAI_CHAT, {"n_predict": -1}, {"n_predict": 256, "max_tokens": 256}),
        (LLAMA_COMPLETION, {"prompt": "x"}, {"prompt": "x", "n_predict": 256}),
        (RESPONSES, {"max_output_tokens": 2000}, {"max_output_tokens": 1024}),
        (ANTHROPIC, {"max_tokens": 32000}, {"max_tokens": 1024}),
        (ANTHROPIC, {"max_tokens": 64}, None),  # nothing to change: the body goes as it came
    ],
)
def test_each_dialect_is_limited_in_its_own_field(dialect, body, expected):
    assert limit_output(body, dialect.output_fields, 256, 1024) == expected


def test_a_cap_alone_bounds_a_request_that_set_no_limit():
    assert limit_output({}, OPENAI_CHAT.output_fields, None, 512) == {"max_tokens": 512}
    assert limit_output({"max_tokens": 9}, OPENAI_CHAT.output_fields, None, 512) is None
