"""The fake's tokenizer and chat template are stable and make conversations share prefixes."""

from itertools import islice

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from crossbar.testing.faketokens import (
    Tokenizer,
    answer_pieces,
    continued_text,
    piece_id,
    render_chat,
    reply_pieces,
    reply_text,
    responses_messages,
    split_pieces,
)

texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": texts}
    ),
    min_size=1,
    max_size=5,
)


def test_words_and_punctuation_are_tokens_with_stable_ids():
    assert split_pieces("Hello, world!") == ["Hello", ",", " world", "!"]
    assert Tokenizer().tokenize("Hello") == [piece_id("Hello")] == Tokenizer().tokenize("Hello")
    # The id is a hash, fixed across processes and runs.
    assert piece_id("Hello") == 214367772


@given(texts)
def test_pieces_join_back_to_the_text_and_detokenize_round_trips(text):
    assert "".join(split_pieces(text)) == text
    tok = Tokenizer()
    assert tok.detokenize(tok.tokenize(text)) == text


@given(messages, messages)
def test_rendering_more_messages_extends_the_tokens_of_fewer(first, more):
    tok = Tokenizer()
    short = tok.tokenize(render_chat(first, add_generation_prompt=False))
    long = tok.tokenize(render_chat(first + more, add_generation_prompt=False))
    assert long[: len(short)] == short


@given(messages, st.integers(0, 40), texts)
def test_a_reply_sent_back_keeps_the_prompt_and_the_generated_tokens_as_prefix(history, n, nxt):
    tok = Tokenizer()
    prompt = tok.tokenize(render_chat(history))
    reply = reply_text(prompt, n)
    generated = tok.ids(p for p, _ in zip(reply_pieces(prompt), range(n), strict=False))
    turn2 = [*history, {"role": "assistant", "content": reply}, {"role": "user", "content": nxt}]
    assert tok.tokenize(render_chat(turn2))[: len(prompt) + n] == prompt + generated


def test_the_same_prompt_gets_the_same_reply_and_a_shorter_one_is_a_prefix():
    prompt = Tokenizer().tokenize("Tell me a story")
    assert reply_text(prompt, 12) == reply_text(prompt, 12)
    assert reply_text(prompt, 12).startswith(reply_text(prompt, 5))
    assert reply_text(prompt, 12) != reply_text(Tokenizer().tokenize("Tell me a joke"), 12)


@given(messages, texts)
def test_a_continued_message_renders_as_the_fresh_prompt_then_its_own_tokens(history, prefix):
    # So a cut answer sent back to its host finds the prompt and what it generated cached.
    tok = Tokenizer()
    assume(history[-1]["role"] != "assistant")  # two trailing ones are a 400, below
    continued = [*history, {"role": "assistant", "content": prefix}]
    fresh = tok.tokenize(render_chat(history))
    assert tok.tokenize(render_chat(continued, prefill=True)) == fresh + tok.tokenize(prefix)


@given(messages, st.integers(1, 30), st.integers(0, 30))
def test_a_cut_reply_continued_goes_on_as_the_uncut_one(history, cut, more):
    assume(history[-1]["role"] != "assistant")
    tok = Tokenizer()
    prompt = tok.tokenize(render_chat(history))
    uncut = reply_text(prompt, cut + more)
    prefix = reply_text(prompt, cut)
    continued = tok.tokenize(render_chat([*history, {"role": "assistant", "content": prefix}],
                                         prefill=True))  # fmt: skip
    pieces, held = answer_pieces(continued, prefix)
    assert held == cut and prefix + "".join(islice(pieces, more)) == uncut


def test_a_prefix_the_fake_never_wrote_gets_a_reply_of_its_own():
    opened = [{"role": "assistant", "content": "Zebra"}]
    prompt = Tokenizer().tokenize(render_chat(opened, prefill=True))
    pieces, held = answer_pieces(prompt, "Zebra")
    assert held == 0 and "".join(islice(pieces, 5)) == reply_text(prompt, 5)


def test_the_continued_text_is_the_text_parts_joined_by_a_blank_line():
    parts = [{"type": "text", "text": "The smallest "}, {"type": "image_url"},
             {"type": "text", "text": "prime is"}]  # fmt: skip
    assert continued_text([{"role": "assistant", "content": parts}]) == "The smallest \n\nprime is"
    assert continued_text([{"role": "user", "content": "hi"}]) is None


def test_two_trailing_assistant_messages_cannot_be_continued():
    two = [{"role": "assistant", "content": "A"}, {"role": "assistant", "content": "B"}]
    with pytest.raises(ValueError, match="2 or more assistant messages at the end"):
        continued_text(two)


def test_an_assistant_message_with_tool_calls_cannot_be_continued():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    use = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    for message in ({"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "assistant", "content": [use]}):  # fmt: skip
        with pytest.raises(ValueError, match="contains tool calls"):
            continued_text([message])


def test_content_parts_render_by_their_text():
    parts = [{"type": "text", "text": "a b"}, {"type": "text", "text": " c"}]
    assert render_chat([{"role": "user", "content": parts}]) == render_chat(
        [{"role": "user", "content": "a b c"}]
    )


def test_responses_input_becomes_chat_messages():
    assert responses_messages("Be brief.", "hi") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    items = [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
    assert responses_messages(None, items) == [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    ]
