"""A named key is found by its secret, checked in constant time, and refused (401) while it is
blocked, expired, or presented with a previous secret past its rotation's grace."""

import pytest
from attrs import evolve

from crossbar.config import KeyLimits, hash_secret
from crossbar.tenants import ClientKey, KeyBook, KeyRefused, new_secret

SECRET = "sk-alice-0123456789abcdef"


def alice(**changes) -> ClientKey:
    return ClientKey(name="alice", sha256=hash_secret(SECRET), routes=("convo",), **changes)


def test_the_secret_finds_its_key_and_an_unknown_secret_finds_none():
    book = KeyBook([alice()])
    assert book.identify(SECRET, now=0).name == "alice"
    assert book.identify(SECRET + "x", now=0) is None
    assert book.identify("", now=0) is None


def test_a_blocked_key_is_refused_not_ignored():
    book = KeyBook([alice(blocked=True)])
    with pytest.raises(KeyRefused) as e:
        book.identify(SECRET, now=0)
    assert e.value.status == 401 and "blocked" in e.value.message


def test_a_key_works_until_its_expiry_and_not_at_it():
    book = KeyBook([alice(expires=100.0)])
    assert book.identify(SECRET, now=99.9).name == "alice"
    with pytest.raises(KeyRefused, match="expired"):
        book.identify(SECRET, now=100.0)


def test_after_a_rotation_the_old_secret_works_for_its_grace_only():
    new = new_secret()
    rotated = evolve(alice(), sha256=hash_secret(new), old_sha256=hash_secret(SECRET), old_until=50)
    book = KeyBook([rotated])
    assert book.identify(new, now=10).name == "alice"
    assert book.identify(SECRET, now=49.9).name == "alice"
    with pytest.raises(KeyRefused, match="rotated"):
        book.identify(SECRET, now=50.0)
    assert book.identify(new, now=1000).name == "alice"


def test_a_changed_key_forgets_its_old_hashes_and_a_removed_one_is_unknown():
    book = KeyBook([alice()])
    other = "sk-alice-another-secret-value"
    book.put(ClientKey(name="alice", sha256=hash_secret(other), routes=("convo",)))
    assert book.identify(SECRET, now=0) is None
    assert book.identify(other, now=0).name == "alice"
    book.remove("alice")
    assert book.identify(other, now=0) is None and len(book) == 0


def test_new_secrets_are_long_random_and_recognisable():
    a, b = new_secret(), new_secret()
    assert a != b and a.startswith("cb-") and len(a) >= 40


def test_scopes_are_globs_of_routes_and_models():
    key = ClientKey("ci", "0" * 64, routes=("proj-*", "review"), models=("qwen-*",))
    assert key.covers_route("proj-alpha") and key.covers_route("review")
    assert not key.covers_route("project") and not key.covers_route("convo")
    assert key.covers_model("qwen-coder") and not key.covers_model("llama")
    assert ClientKey("any", "0" * 64).covers_model("anything")


def test_a_key_cost_counts_cached_prompt_tokens_at_their_weight():
    limits = KeyLimits(cached_weight=0.1)
    assert limits.cost(prompt=1000, cached=900, completion=50) == pytest.approx(100 + 90 + 50)
    assert KeyLimits(cached_weight=0.0).cost(100, 100, 0) == 0
