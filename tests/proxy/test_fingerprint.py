"""A conversation keeps one fingerprint from turn 1 to turn 40; two conversations do not share one."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crossbar.proxy.fingerprint import SESSION_HEADERS, fingerprint, scoped
from crossbar.wire.dialects import classify

CHAT = "/v1/chat/completions"


def fp(header, body, path: str, chars: int = 4096) -> str:
    """The fingerprint of a request to `path`, in the dialect crossbar picks for it."""
    return fingerprint(header, body, classify("POST", path)[0], chars)


def no_headers(name):
    return None


def headers(**values):
    table = {k.replace("_", "-").lower(): v for k, v in values.items()}
    return lambda name: table.get(name.lower())


def chat(turns: int, first: str = "Write a parser.", system: str = "You are a coder.") -> dict:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": first}]
    for i in range(1, turns):
        messages.append({"role": "assistant", "content": f"reply {i}"})
        messages.append({"role": "user", "content": f"follow-up {i}"})
    return {"model": "qwen-coder", "messages": messages}


def test_a_fingerprint_is_16_hex_chars_of_sha256():
    assert re.fullmatch(r"[0-9a-f]{16}", fp(no_headers, chat(1), CHAT))


def test_turn_1_and_turn_40_of_one_conversation_share_a_fp():
    assert fp(no_headers, chat(1), CHAT) == fp(no_headers, chat(40), CHAT)


def test_conversations_differing_in_their_first_user_message_differ():
    a = fp(no_headers, chat(3, first="Write a parser."), CHAT)
    b = fp(no_headers, chat(3, first="Write a lexer."), CHAT)
    assert a != b


def test_the_system_prompt_is_part_of_the_conversation():
    a = fp(no_headers, chat(1, system="You are terse."), CHAT)
    b = fp(no_headers, chat(1, system="You are verbose."), CHAT)
    assert a != b


def test_developer_messages_lead_like_system_messages():
    body = {"messages": [{"role": "developer", "content": "d"}, {"role": "user", "content": "u"}]}
    other = {"messages": [{"role": "developer", "content": "e"}, {"role": "user", "content": "u"}]}
    assert fp(no_headers, body, CHAT) != fp(no_headers, other, CHAT)


@pytest.mark.parametrize("name", SESSION_HEADERS)
def test_a_session_header_decides_whatever_the_body_says(name):
    h = lambda n: "sess-42" if n == name else None  # noqa: E731
    assert fp(h, chat(1, first="a"), CHAT) == fp(h, chat(1, first="b"), CHAT)
    assert fp(h, chat(1), CHAT) != fp(no_headers, chat(1), CHAT)


def test_session_headers_are_trusted_in_their_order():
    both = headers(X_Crossbar_Conversation="mine", X_Session_Id="theirs")
    assert fp(both, None, CHAT) == fp(headers(X_Session_Id="mine"), None, CHAT)


def test_prompt_cache_key_comes_after_the_headers_and_before_the_messages():
    a = {**chat(1, first="a"), "prompt_cache_key": "k1"}
    b = {**chat(1, first="b"), "prompt_cache_key": "k1"}
    assert fp(no_headers, a, CHAT) == fp(no_headers, b, CHAT)
    assert fp(headers(X_Session_Id="s"), a, CHAT) == fp(headers(X_Session_Id="s"), None, CHAT)


def test_text_parts_count_by_their_text():
    plain = {"messages": [{"role": "user", "content": "hello"}]}
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]}
    assert fp(no_headers, plain, CHAT) == fp(no_headers, parts, CHAT)


def test_images_count_by_a_hash_of_their_data():
    def with_image(data):
        return {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {
                            "type": "image_url",
                            "image_url": {"url": f"data:image/png;base64,{data}"},
                        },
                    ],
                }
            ]
        }

    a, b = with_image("AAAA"), with_image("BBBB")
    assert fp(no_headers, a, CHAT) != fp(no_headers, b, CHAT)
    assert fp(no_headers, a, CHAT) == fp(no_headers, with_image("AAAA"), CHAT)


def test_anthropic_messages_use_the_system_field_and_the_first_user_message():
    def body(system, turns):
        msgs = [{"role": "user", "content": [{"type": "text", "text": "start"}]}]
        msgs += [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}] * turns
        return {"system": system, "messages": msgs}

    path = "/v1/messages"
    assert fp(no_headers, body("s", 0), path) == fp(no_headers, body("s", 9), path)
    assert fp(no_headers, body("s", 0), path) != fp(no_headers, body("t", 0), path)


def test_responses_instructions_and_input_make_a_conversation():
    path = "/v1/responses"
    a = {"instructions": "be brief", "input": "hi"}
    b = {
        "instructions": "be brief",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
    }
    later = {**b, "input": [*b["input"], {"role": "assistant", "content": "yo"}]}
    assert fp(no_headers, a, path) == fp(no_headers, b, path)
    assert fp(no_headers, b, path) == fp(no_headers, later, path)
    assert fp(no_headers, {"instructions": "other", "input": "hi"}, path) != fp(no_headers, a, path)


def test_a_raw_prompt_is_hashed_over_its_first_fingerprint_chars():
    base = "x" * 100
    a = {"prompt": base + " first ending"}
    b = {"prompt": base + " another ending entirely"}
    assert fp(no_headers, a, "/completion", chars=100) == fp(
        no_headers, b, "/completion", chars=100
    )
    assert fp(no_headers, a, "/completion", chars=4096) != fp(
        no_headers, b, "/completion", chars=4096
    )


def test_infill_uses_its_input_prefix():
    a = {"input_prefix": "def f(", "input_suffix": "1"}
    b = {"input_prefix": "def f(", "input_suffix": "2"}
    assert fp(no_headers, a, "/infill") == fp(no_headers, b, "/infill")
    assert fp(no_headers, a, "/infill") != ""


@pytest.mark.parametrize(
    ("body", "path"),
    [
        (None, CHAT),
        ({}, CHAT),
        ({"model": "m"}, "/slots"),
        ({"input": "embed me"}, "/v1/embeddings"),
        ({"messages": []}, CHAT),
    ],
)
def test_anything_else_means_the_route_itself(body, path):
    assert fp(no_headers, body, path) == ""


@given(
    first=st.text(min_size=1, max_size=50),
    later=st.lists(st.text(max_size=20), max_size=10),
)
def test_any_number_of_later_turns_keeps_the_fp(first, later):
    msgs = [{"role": "user", "content": first}]
    grown = msgs + [
        {"role": "assistant" if i % 2 == 0 else "user", "content": t} for i, t in enumerate(later)
    ]
    assert fp(no_headers, {"messages": msgs}, CHAT) == fp(no_headers, {"messages": grown}, CHAT)


def test_a_named_key_scopes_a_fingerprint_and_no_key_leaves_it_as_it_was():
    session = fp(headers(x_session_id="S"), {}, CHAT)
    ann, ben = scoped(session, "ann"), scoped(session, "ben")
    assert re.fullmatch(r"[0-9a-f]{16}", ann)
    assert len({session, ann, ben}) == 3
    assert scoped(session, "ann") == ann  # the same key, the same conversation
    assert scoped(session, "") == session
    assert scoped("", "ann") == ""  # "the route itself" stays the route itself
