"""The fake's tokenizer and chat template are stable and make conversations share prefixes."""

from hypothesis import given
from hypothesis import strategies as st

from crossbar.testing.faketokens import (
    Tokenizer,
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
