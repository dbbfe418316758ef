"""A usage row no column can hold is dropped at once and counted, never retried: on SQLite and
PostgreSQL alike, the store stays well and the rows beside it are written (issue 47: one
answer reporting 2^63 tokens kept the store degraded until a restart)."""

import math

import pytest
import pytest_twisted

from crossbar.leases.table import Key, Lease, State
from crossbar.records import UsageRow


def usage(at: float, **kw) -> UsageRow:
    fields = {"route": "r", "fp": "f", "model": "m", "host": "a", "path": "/v1/chat/completions",
              "status": 200, "stream": False, **kw}  # fmt: skip
    return UsageRow(at, **fields)


@pytest.mark.parametrize(
    ("row", "why"),
    [
        ({"prompt_tokens": 2**63}, "integer_out_of_range"),
        ({"completion_tokens": 2**31}, "integer_out_of_range"),  # PostgreSQL's INTEGER
        ({"duration_ms": math.nan}, "number_not_finite"),
        ({"queue_ms": math.inf}, "number_not_finite"),
        ({"error": "bad\x00byte"}, "text_not_storable"),
        ({"path": "/v1/\udcff"}, "text_not_storable"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_row_no_column_holds_is_dropped_and_its_neighbours_written(store, row, why):
    lease = Lease(Key("r", "f", "m"), "a", State.ACTIVE, 1.0, 1.0)
    await store.record_usage_rows([usage(1.0), usage(2.0, **row), usage(3.0)])
    await store.apply(save=[lease], events=[])  # the next group writes, as any other
    await store.record_usage(usage(4.0, prompt_tokens=2**31 - 1))  # the largest count allowed
    assert store.dropped_rows == {why: 1}
    totals = await store.usage_totals("host")
    assert totals[0]["requests"] == 3
    assert await store.list_leases() == [lease]
