"""What the store tells the operator about batches, on SQLite and PostgreSQL alike: every
batch by status and the items of those not ended by state (for /metrics); a page of every
route's and key's batches, filtered by status; a batch with its events."""

import pytest_twisted

from crossbar.batches.objects import not_run_line
from crossbar.store import FileRow
from tests.support.batches import add_batch, batch_row, end_items


@pytest_twisted.ensureDeferred
async def test_the_tally_counts_every_batch_by_status_and_only_the_unended_ones_items(store):
    empty = await store.batch_tally()
    assert set(empty.batches.values()) == {0} and len(empty.batches) == 8
    assert empty.items == {"pending": 0, "running": 0, "done": 0, "failed": 0}

    # One batch runs to the end: its item stops counting once it is completed.
    await add_batch(store, batch_row("batch_old", created=1.0, total=1))
    await end_items(store, "batch_old", done=1)
    assert await store.start_finalizing(3000.0, 3060.0) == ["batch_old"]
    output = FileRow("file-o", "convo", "", "batch_output", "o.jsonl", 0, 0, 3000.0)
    error = FileRow("file-e", "convo", "", "batch_output", "e.jsonl", 0, 0, 3000.0)
    assert await store.finish_batch("batch_old", 3000.0, output, error) == "completed"
    # One runs: 2 done, 1 failed, 1 running, 2 pending.
    await add_batch(store, batch_row("batch_run", created=2.0, total=6))
    await end_items(store, "batch_run", done=2, failed=1)
    await store.claim_items("tests", 2000.0, 2060.0, 1)
    # One is cancelled: its 3 items not run end in the error file, yet it is not over.
    await add_batch(store, batch_row("batch_stop", created=3.0, total=3))
    assert await store.cancel_batch("batch_stop", 2500.0, not_run_line) == "cancelling"

    tally = await store.batch_tally()
    assert {s: n for s, n in tally.batches.items() if n} == {
        "completed": 1, "in_progress": 1, "cancelling": 1,
    }  # fmt: skip
    assert tally.items == {"pending": 2, "running": 1, "done": 2, "failed": 1 + 3}


@pytest_twisted.ensureDeferred
async def test_the_operators_page_holds_every_route_and_key_newest_first_filtered_by_status(
    store,
):
    for i, (route, key) in enumerate([("convo", ""), ("bulk", "alice"), ("convo", "bob")]):
        await add_batch(store, batch_row(f"batch_{i}", route, key, created=10.0 + i))
    assert await store.cancel_batch("batch_1", 50.0, not_run_line) == "cancelling"

    page = await store.batch_page(None, None, None, "", 10)
    assert [(b.id, b.route, b.key) for b in page] == [
        ("batch_2", "convo", "bob"), ("batch_1", "bulk", "alice"), ("batch_0", "convo", ""),
    ]  # fmt: skip
    assert [b.id for b in await store.batch_page(None, None, None, "batch_2", 1)] == ["batch_1"]
    assert [b.id for b in await store.batch_page("convo", None, None, "", 10)] == [
        "batch_2", "batch_0",
    ]  # fmt: skip
    assert [b.id for b in await store.batch_page(None, "alice", None, "", 10)] == ["batch_1"]
    in_progress = await store.batch_page(None, None, "in_progress", "", 10)
    assert [b.id for b in in_progress] == ["batch_2", "batch_0"]
    (cancelling,) = await store.batch_page(None, None, "cancelling", "", 10)
    assert cancelling.id == "batch_1" and cancelling.counts.failed == 4


@pytest_twisted.ensureDeferred
async def test_a_batch_report_is_the_row_and_its_events_newest_first(store):
    await add_batch(store, batch_row("batch_a", created=10.0, total=2))
    await store.cancel_batch("batch_a", 20.0, not_run_line)
    row, events = await store.batch_report("batch_a", 10)
    assert row is not None and row.status == "cancelling"
    assert [(e.at, e.status, e.detail) for e in events] == [
        (20.0, "cancelling", "2 requests not run"),
        (10.0, "in_progress", "2 requests to /v1/chat/completions"),
    ]
    assert await store.batch_report("batch_none", 10) == (None, [])
