"""A session id is the conversation of the key that sends it: two named keys sending one session
id (or one opening) get a lease each, and the lease headers say so; a request with no named key
is fingerprinted as ever; and after the upgrade that scoped fingerprints, a conversation whose
lease was made under its old fingerprint makes a new lease on that same host, warm."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.threads import deferToThread

from crossbar.leases.types import Change, Key, Lease, State
from crossbar.proxy.fingerprint import fingerprint
from crossbar.records import LeaseEvent
from crossbar.wire import OPENAI_CHAT
from tests.support.harness import MODEL, Crossbar, start_crossbar, start_fakes, wait
from tests.support.lease_fakes import open_store

ANN = "sk-ann-5f0c1d2e3b4a"
BEN = "sk-ben-9e8d7c6b5a40"
SHARED = "sk-shared-anonymous-1"
SESSION = "9a1f6c2e-session-of-ann"
HOSTS = ("titan", "atlas")
ROUTES = {
    "team": {"hosts": list(HOSTS), "default_model": MODEL, "auth": "keys"},
    "open": {"hosts": list(HOSTS), "default_model": MODEL},
    "shared": {"hosts": list(HOSTS), "default_model": MODEL, "keys": [SHARED]},
}
KEYS = {
    "ann": {"secret": ANN, "routes": ["team", "open"]},
    "ben": {"secret": BEN, "routes": ["team", "open"]},
}


async def start(server: dict[str, Any] | None = None) -> Crossbar:
    fakes = await start_fakes(*HOSTS, tokens_per_second=2000)
    return await start_crossbar(fakes, ROUTES, server=server, keys=KEYS)


@pytest_twisted.async_yield_fixture
async def crossbar():
    running = await start()
    yield running
    await running.stop()


def send(
    crossbar: Crossbar, route: str, key: str, text: str = "Refactor the parser.", **extra: Any
) -> Callable[[], tuple[str, str]]:
    """One chat turn through the official client: (X-Crossbar-Lease, X-Crossbar-Host)."""

    def call() -> tuple[str, str]:
        client = openai.OpenAI(base_url=crossbar.url(route, "/v1"), api_key=key, max_retries=0)
        with client:
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=8, **extra
            )
            raw.parse()
            return raw.headers["X-Crossbar-Lease"], raw.headers["X-Crossbar-Host"]

    return call


async def turn(call: Callable[[], tuple[str, str]]) -> tuple[str, str]:
    return await wait(deferToThread(call), 60)


def session(value: str = SESSION) -> dict[str, Any]:
    return {"extra_headers": {"X-Session-Id": value}}


def unscoped(value: str = SESSION) -> str:
    """The fingerprint every version gives the session id `value` sent with no named key, and
    the one versions before scoping gave it whoever sent it."""
    header = {"x-session-id": value}
    return fingerprint(lambda name: header.get(name.lower()), {}, OPENAI_CHAT)


def leases(crossbar: Crossbar, route: str) -> dict[str, str]:
    return {lease.key.fp: lease.host for lease in crossbar.parts.table.snapshot(route)}


SENT_AS = {
    "X-Session-Id": {"extra_headers": {"X-Session-Id": SESSION}},
    "X-Claude-Code-Session-Id": {"extra_headers": {"X-Claude-Code-Session-Id": SESSION}},
    "prompt_cache_key": {"extra_body": {"prompt_cache_key": SESSION}},
}


@pytest.mark.parametrize("sent_as", list(SENT_AS))
@pytest_twisted.ensureDeferred
async def test_one_session_id_sent_by_two_keys_makes_two_leases_each_reused_by_its_own_key(
    crossbar, sent_as
):
    extra = SENT_AS[sent_as]
    ann = await turn(send(crossbar, "team", ANN, "Ann's parser.", **extra))
    ben = await turn(send(crossbar, "team", BEN, "Ben's question.", **extra))
    assert ann == ("new", "titan")
    assert ben == ("new", "atlas")  # not ann's lease: placed as any new conversation
    assert await turn(send(crossbar, "team", ANN, "Ann's parser.", **extra)) == ("reused", "titan")
    assert await turn(send(crossbar, "team", BEN, "Ben's question.", **extra)) == (
        "reused",
        "atlas",
    )
    held = leases(crossbar, "team")
    assert sorted(held.values()) == ["atlas", "titan"]
    assert unscoped() not in held


@pytest_twisted.ensureDeferred
async def test_one_opening_sent_by_two_keys_makes_two_leases(crossbar):
    # No session id: the conversation's opening is the fingerprint, scoped all the same.
    assert await turn(send(crossbar, "team", ANN, "Hello.")) == ("new", "titan")
    assert await turn(send(crossbar, "team", BEN, "Hello.")) == ("new", "atlas")
    assert await turn(send(crossbar, "team", BEN, "Hello.")) == ("reused", "atlas")
    assert len(leases(crossbar, "team")) == 2


@pytest_twisted.ensureDeferred
async def test_a_request_with_no_named_key_keeps_its_fingerprint_and_its_lease(crossbar):
    # An open route without a key, and a route's own anonymous keys: as before, one session id
    # is one conversation whoever sends it, under the fingerprint every version gives it.
    for route, key in (("open", "no-key"), ("shared", SHARED)):
        lease, host = await turn(send(crossbar, route, key, "First client.", **session()))
        assert lease == "new"
        second = await turn(send(crossbar, route, key, "Second client.", **session()))
        assert second == ("reused", host)
        assert leases(crossbar, route) == {unscoped(): host}


@pytest_twisted.ensureDeferred
async def test_a_named_key_never_lands_on_a_lease_made_since_start_without_a_key(crossbar):
    assert await turn(send(crossbar, "open", "no-key", **session())) == ("new", "titan")
    assert await turn(send(crossbar, "open", ANN, **session())) == ("new", "atlas")
    assert sorted(leases(crossbar, "open").values()) == ["atlas", "titan"]


async def store_with_old_lease(path: str, host: str, created: float) -> Lease:
    """A store as a version before scoping left it: the session's lease under its old key."""
    key = Key("team", unscoped(), MODEL)
    old = Lease(key, host, State.ACTIVE, created=created, last_used=created)
    event = LeaseEvent(created, key.route, key.fp, key.model, "", host, "new")
    store = await open_store(path)
    try:
        await store.write(Change(save=[old], events=[event], expect=(key, "")))
    finally:
        await store.close()
    return old


@pytest_twisted.ensureDeferred
async def test_after_the_upgrade_a_conversation_makes_a_new_lease_on_its_old_host(tmp_path):
    db = str(tmp_path / "crossbar.db")
    # On atlas, where the chooser would not put a new conversation (titan holds nothing).
    old = await store_with_old_lease(db, "atlas", reactor.seconds() - 60)
    running = await start({"db": db})
    try:
        assert running.parts.table.lease(old.key) == old
        first = await turn(send(running, "team", ANN, **session()))
        assert first == ("new", "atlas")  # a lease of its own, on the host that holds it warm
        assert await turn(send(running, "team", ANN, **session())) == ("reused", "atlas")
        held = leases(running, "team")
        assert len(held) == 2 and set(held.values()) == {"atlas"}
        # The old lease is left as it was, unused: the sweep expires it after lease_idle.
        assert running.parts.table.lease(old.key) == old
    finally:
        await running.stop()


@pytest_twisted.ensureDeferred
async def test_after_the_upgrade_an_old_lease_on_a_draining_host_is_not_followed(tmp_path):
    db = str(tmp_path / "crossbar.db")
    await store_with_old_lease(db, "atlas", reactor.seconds() - 60)
    running = await start({"db": db})
    try:
        await running.parts.hosts.drain("atlas")
        assert await turn(send(running, "team", ANN, **session())) == ("new", "titan")
    finally:
        await running.stop()
