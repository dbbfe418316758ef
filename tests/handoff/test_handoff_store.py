"""The hand-off store keeps each conversation's latest body: compressed, on disk, bounded."""

from __future__ import annotations

import os
import shutil
import zlib

import pytest_twisted
from twisted.internet import reactor

from crossbar.handoff.kept import HandoffStore
from crossbar.handoff.parts import store_parent
from crossbar.leases.table import Key
from tests.support.harness import wait


def body(n: int, size: int = 4000) -> bytes:
    # Text that compresses as prompts do, and differs per conversation.
    return (f'{{"messages": "{n} ' + "the parser reads tokens " * (size // 24) + '"}').encode()


def key(n: int) -> Key:
    return Key("convo", f"fp{n}", "qwen")


@pytest_twisted.ensureDeferred
async def test_bodies_are_kept_compressed_on_disk_and_read_back(tmp_path):
    store = HandoffStore(reactor, 1 << 20, 1 << 20, str(tmp_path))
    try:
        store.keep(key(1), body(1))
        assert await wait(store.load(key(1))) == body(1)
        assert await wait(store.load(key(2))) is None
        (name,) = os.listdir(store.directory)
        on_disk = (tmp_path / os.path.basename(store.directory) / name).read_bytes()
        assert zlib.decompress(on_disk) == body(1)
        assert store.stats()["bytes"] == len(on_disk) < len(body(1)) / 4
    finally:
        store.close()
    assert os.listdir(tmp_path) == []  # the directory goes with the store


@pytest_twisted.ensureDeferred
async def test_the_least_recently_used_bodies_go_when_the_store_is_full(tmp_path):
    one = len(zlib.compress(body(0), 1))
    store = HandoffStore(reactor, int(one * 3.5), 1 << 20, str(tmp_path))
    try:
        for n in range(3):
            store.keep(key(n), body(n))
        await wait(store.flushed())
        await wait(store.load(key(0)))  # used again: now the most recent
        store.keep(key(3), body(3))
        await wait(store.flushed())
        assert await wait(store.load(key(1))) is None  # the least recently used went
        for n in (0, 2, 3):
            assert await wait(store.load(key(n))) == body(n)
        assert store.stats()["evicted"] == 1 and store.stats()["bodies"] == 3
        assert store.stats()["bytes"] <= store.capacity
    finally:
        store.close()


@pytest_twisted.ensureDeferred
async def test_a_body_over_handoff_max_body_is_not_kept_nor_the_stale_one_before_it(tmp_path):
    store = HandoffStore(reactor, 1 << 20, 5000, str(tmp_path))
    try:
        store.keep(key(1), body(1, 1000))
        store.keep(key(1), body(1, 8000))
        assert await wait(store.load(key(1))) is None
        store.keep(key(2), body(2, 1000))
        store.drop(key(2))  # its lease is gone: so is its body
        assert await wait(store.load(key(2))) is None
        assert store.stats()["bodies"] == 0
    finally:
        store.close()


@pytest_twisted.ensureDeferred
async def test_size_zero_is_off_and_touches_no_disk(tmp_path):
    store = HandoffStore(reactor, 0, 1 << 20, str(tmp_path))
    assert not store.enabled
    store.keep(key(1), body(1))
    assert await wait(store.load(key(1))) is None
    store.close()
    assert os.listdir(tmp_path) == []


def test_the_store_lives_beside_a_sqlite_file_else_in_the_temp_dir():
    assert store_parent("/var/lib/crossbar/crossbar.db") == "/var/lib/crossbar"
    assert store_parent(":memory:") is None
    assert store_parent("postgresql://crossbar@db/crossbar") is None


@pytest_twisted.ensureDeferred
async def test_bodies_asked_while_a_batch_is_written_go_in_the_next_one_newest_only(tmp_path):
    store = HandoffStore(reactor, 1 << 20, 1 << 20, str(tmp_path))
    try:
        store.keep(key(1), body(1))  # this batch goes to the thread at once...
        store.keep(key(2), body(2, 1000))  # ...these wait for it, and the newer body of
        store.keep(key(2), body(2, 2000))  # conversation 2 replaces the older
        assert await wait(store.load(key(2))) == body(2, 2000)  # read before it is written
        await wait(store.flushed())
        assert store.stats()["bodies"] == 2
        assert await wait(store.load(key(2))) == body(2, 2000)
    finally:
        store.close()


@pytest_twisted.ensureDeferred
async def test_a_deleted_directory_is_made_again_and_nothing_is_logged_as_a_crash(tmp_path):
    from twisted.logger import globalLogPublisher

    seen = []
    globalLogPublisher.addObserver(seen.append)
    store = HandoffStore(reactor, 1 << 20, 1 << 20, str(tmp_path))
    try:
        store.keep(key(1), body(1))
        await wait(store.flushed())
        shutil.rmtree(store.directory)  # a tmp cleaner, an operator's rm
        store.keep(key(2), body(2))
        await wait(store.flushed())
        assert await wait(store.load(key(2))) == body(2)  # written into the directory made again
        assert await wait(store.load(key(1))) is None  # gone with the old one: moves go cold
        assert store.stats()["bodies"] == 1 and store.stats()["error"] is None
    finally:
        globalLogPublisher.removeObserver(seen.append)
        store.close()
    assert not [e for e in seen if e.get("log_failure") is not None]  # no traceback


@pytest_twisted.ensureDeferred
async def test_a_store_that_cannot_write_says_so_once_and_recovers_by_itself(tmp_path):
    from twisted.logger import globalLogPublisher

    seen = []
    globalLogPublisher.addObserver(seen.append)
    parent = tmp_path / "parent"
    parent.mkdir()
    store = HandoffStore(reactor, 1 << 20, 1 << 20, str(parent))
    try:
        shutil.rmtree(parent)  # the directory and its parent: it cannot be made again
        (tmp_path / "parent").write_text("a file where the directory was")
        for n in range(3):
            store.keep(key(n), body(n))
            await wait(store.flushed())
        assert store.stats()["error"] and "parent" in store.stats()["error"]
        said = [e for e in seen if "hand-off store cannot write" in str(e.get("log_format"))]
        assert len(said) == 1  # once, not per write
        os.unlink(tmp_path / "parent")
        store.keep(key(9), body(9))
        await wait(store.flushed())
        assert store.stats()["error"] is None
        assert await wait(store.load(key(9))) == body(9)
    finally:
        globalLogPublisher.removeObserver(seen.append)
        store.close()
    assert not [e for e in seen if e.get("log_failure") is not None]
