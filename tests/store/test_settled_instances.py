"""Two instances on one store: the rows one instance keeps for its reports do not outlive
usage another instance pruned, even when its own prune finds nothing left to delete."""

import pytest_twisted

from tests.store.test_usage_rollups import DAY, NOW, roll_up_all, usage
from tests.support.lease_fakes import open_store


@pytest_twisted.ensureDeferred
async def test_another_instances_prune_shows_in_this_instances_next_report(shared_url):
    a, b = await open_store(shared_url), await open_store(shared_url)
    try:
        await a.record_usage_rows([usage(NOW - 20 * DAY), usage(NOW - 3 * DAY)])
        await roll_up_all(a, NOW, raw_before=NOW - 2 * DAY)
        assert (await b.usage_totals("route"))[0]["requests"] == 2  # b keeps the sums' rows
        # Both sweep every 30 s; a prunes first and deletes the old day's sums, so b's own
        # prune, 30 s later, finds nothing left to delete.
        await a.prune(events_before=0.0, usage_before=NOW - 10 * DAY)
        await b.prune(events_before=0.0, usage_before=NOW - 10 * DAY + 30.0)
        assert (await a.usage_totals("route"))[0]["requests"] == 1
        assert (await b.usage_totals("route"))[0]["requests"] == 1
    finally:
        await a.close()
        await b.close()
