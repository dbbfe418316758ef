"""/metrics on batches: the store's batches by status and the unended ones' items by state, as
the batch runner read them at its last tick (every instance's), and what came of the items this
instance ran. A scrape reads what is in memory; it never waits for the store."""

import pytest_twisted
from prometheus_client.parser import text_string_to_metric_families

from crossbar.batches.objects import not_run_line
from tests.support.batches import add_batch, batch_row, client, end_items, run_to_end, submit
from tests.support.harness import start_crossbar, start_fakes

ROUTES = {"convo": {"hosts": ["a"]}}


def scrape(crossbar, name: str) -> dict[str, float]:
    """The samples of the metric `name`, by their one label's value."""
    found = {}
    for family in text_string_to_metric_families(crossbar.parts.metrics.render().decode()):
        for s in family.samples:
            if s.name == name:
                (value,) = s.labels.values()
                found[value] = s.value
    return found


@pytest_twisted.async_yield_fixture
async def crossbar():
    running = await start_crossbar(await start_fakes("a"), ROUTES)
    yield running
    await running.stop()


@pytest_twisted.ensureDeferred
async def test_the_gauges_show_every_batch_by_status_and_the_unended_ones_items_by_state(crossbar):
    # Before the runner's first read, crossbar does not know: no samples rather than zeros.
    assert scrape(crossbar, "crossbar_batches") == {}
    assert scrape(crossbar, "crossbar_batch_items") == {}
    store = crossbar.parts.store
    # One batch runs (another instance may run it: the store is every instance's)...
    await add_batch(store, batch_row("batch_run", created=1.0, total=6))
    await end_items(store, "batch_run", done=2, failed=1)
    await store.claim_items("another-instance", 2000.0, 2060.0, 1)
    # ... and one is being cancelled: its three items not run end at once.
    await add_batch(store, batch_row("batch_stop", created=2.0, total=3))
    await store.cancel_batch("batch_stop", 2500.0, not_run_line)

    await crossbar.parts.batches.refresh_snapshot()

    batches = scrape(crossbar, "crossbar_batches")
    assert set(batches) == {
        "validating", "in_progress", "finalizing", "cancelling", "completed", "failed",
        "expired", "cancelled",
    }  # fmt: skip
    assert {s: n for s, n in batches.items() if n} == {"in_progress": 1, "cancelling": 1}
    items = scrape(crossbar, "crossbar_batch_items")
    assert items == {"pending": 2, "running": 1, "done": 2, "failed": 1 + 3}


@pytest_twisted.ensureDeferred
async def test_a_batch_run_to_its_end_counts_its_items_outcomes_and_leaves_no_items_counted(
    crossbar,
):
    assert scrape(crossbar, "crossbar_batch_item_outcomes_total") == {
        "done": 0, "failed": 0, "retried": 0, "lost": 0,
    }  # fmt: skip
    batch_id = await submit(client(crossbar), 3)
    assert (await run_to_end(crossbar, batch_id)).status == "completed"

    outcomes = scrape(crossbar, "crossbar_batch_item_outcomes_total")
    assert outcomes == {"done": 3, "failed": 0, "retried": 0, "lost": 0}
    # The tick that finalized it read the store again: the batch is completed, and a completed
    # batch's items are no longer counted.
    assert scrape(crossbar, "crossbar_batches")["completed"] == 1
    assert set(scrape(crossbar, "crossbar_batch_items").values()) == {0}


@pytest_twisted.ensureDeferred
async def test_when_the_store_cannot_be_read_the_last_numbers_stay_and_the_runner_says_why(
    crossbar,
):
    store, runner = crossbar.parts.store, crossbar.parts.batches
    await add_batch(store, batch_row("batch_run", total=2))
    await runner.refresh_snapshot()
    assert scrape(crossbar, "crossbar_batch_items")["pending"] == 2

    await store.close()
    await runner.refresh_snapshot()

    assert scrape(crossbar, "crossbar_batch_items")["pending"] == 2
    assert scrape(crossbar, "crossbar_batches")["in_progress"] == 1
    assert "counting batches after close" in runner.degraded
