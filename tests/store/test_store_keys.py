"""Client keys in the store, on SQLite and PostgreSQL alike: the config seeds them without
undoing the operator's changes, every write is a change-log row the others follow, no secret is
kept, and each instance's spending is summed for the others; usage rows and their sums name
their key."""

import json
import time

import pytest_twisted
from attrs import evolve

from crossbar.config import KeyConfig, KeyLimits, hash_secret
from crossbar.records import UsageRow
from crossbar.tenants import API, ClientKey, from_config, period_ids
from crossbar.tenants.meter import period_start
from tests.support.lease_fakes import open_store

SECRET = "sk-store-secret-0001"


def seed(name="dev", **changes) -> ClientKey:
    config = KeyConfig(name, hash_secret(SECRET + name), routes=("team",), **changes)
    return from_config(config, now=10.0)


@pytest_twisted.ensureDeferred
async def test_a_key_goes_in_and_comes_back_whole_with_a_change_row(store):
    key = ClientKey(
        "ci", hash_secret(SECRET), routes=("team", "proj-*"), models=("qwen-*",), expires=99.5,
        limits=KeyLimits(tpm=1000, tokens_per_day=5, cached_weight=0.25, weight=2.0),
        created=1.0, source=API,
    )  # fmt: skip
    before = await store.last_change()
    assert await store.create_key(key)
    assert not await store.create_key(evolve(key, routes=("x",)))  # the name is taken
    assert await store.list_keys() == [key]
    assert await store.list_keys(["ci", "nobody"]) == [key]
    changes = await store.changes_since(before)
    assert [(c.kind, c.route) for c in changes] == [("key", "ci")]
    blocked = evolve(key, blocked=True, old_sha256=hash_secret("old"), old_until=50.0)
    await store.save_key(blocked)
    assert await store.list_keys() == [blocked]
    assert await store.delete_key("ci") and not await store.delete_key("ci")
    assert await store.list_keys() == []
    changes = await store.changes_since(before)
    assert [(c.kind, c.route) for c in changes] == [("key", "ci")] * 3


@pytest_twisted.ensureDeferred
async def test_seeding_keeps_the_operators_changes_to_an_unchanged_entry(store):
    (dev,) = await store.seed_keys([seed()])
    await store.save_key(evolve(dev, blocked=True))  # the operator blocked it
    await store.create_key(ClientKey("api", hash_secret("a" * 20), routes=("team",)))
    keys = await store.seed_keys([seed()])  # a restart with the same config
    assert [(k.name, k.blocked) for k in keys] == [("api", False), ("dev", True)]
    keys = await store.seed_keys([seed(limits=KeyLimits(rpm=5))])  # the entry changed
    assert [(k.name, k.blocked, k.limits.rpm) for k in keys] == [
        ("api", False, None),
        ("dev", False, 5),
    ]
    keys = await store.seed_keys([])  # the config dropped [keys.dev]
    assert [k.name for k in keys] == ["api"]


@pytest_twisted.ensureDeferred
async def test_the_store_holds_hashes_of_secrets_never_a_secret(tmp_path):
    path = str(tmp_path / "keys.db")
    store = await open_store(path)
    try:
        await store.seed_keys([seed()])
    finally:
        await store.close()
    data = b"".join(p.read_bytes() for p in tmp_path.glob("keys.db*"))  # the WAL too
    assert SECRET.encode() not in data and hash_secret(SECRET + "dev").encode() in data


@pytest_twisted.ensureDeferred
async def test_each_instance_reads_the_others_spending_not_its_own(store):
    day, month = period_ids(time.time())  # the store prunes periods long over by its clock
    starts = period_start(day)
    store.instance = "a"
    assert await store.sync_spend([("ci", day, 100.0, starts)], [day]) == {}
    store.instance = "b"
    rows = [("ci", day, 40.0, starts), ("ci", month, 40.0, period_start(month))]
    assert await store.sync_spend(rows, [day, month]) == {("ci", day): 100.0}
    store.instance = "a"
    others = await store.sync_spend([("ci", day, 150.0, starts)], [day, month])
    assert others == {("ci", day): 40.0, ("ci", month): 40.0}
    old = period_ids(time.time() - 90 * 86400)[0]
    store.instance = "c"
    await store.sync_spend([("ci", old, 5.0, period_start(old))], [old])
    store.instance = "a"
    assert await store.sync_spend([], [old]) == {}  # pruned: that day is long over


@pytest_twisted.ensureDeferred
async def test_usage_rows_name_their_key_and_totals_by_key_read_rows_and_sums(store):
    def row(at, key):
        return UsageRow(at, "team", "f", "m", "a", "/v1/chat/completions", 200, False,
                        prompt_tokens=10, completion_tokens=5, key=key)  # fmt: skip

    now = 1_780_000_000.0
    await store.record_usage_rows([row(now - 7200, "dev"), row(now - 10, "dev"), row(now, "")])
    await store.roll_up(now, raw_before=now - 3600)  # the old row is only in the sums now
    totals = await store.usage_totals("key", since=now - 86400)
    assert [(t["key"], t["requests"], t["prompt_tokens"]) for t in totals] == [
        ("", 1, 10),
        ("dev", 2, 20),
    ]
    assert json.dumps(totals).count("dev") == 1
