"""The operator's view of batches in the admin API: every route's and key's batches with their
progress, tokens and ETA, one batch with its events, and a cancel that is the client's own."""

import json

import pytest
import pytest_twisted
from attrs import evolve
from twisted.internet import reactor

from crossbar.admin.batches import batch_view, eta_seconds
from crossbar.batches.objects import not_run_line
from crossbar.store import Counts
from tests.support.batches import (
    add_batch,
    batch_row,
    call,
    client,
    end_items,
    listen_admin,
    run_to_end,
    submit,
)
from tests.support.harness import start_crossbar, start_fakes, wait

ALICE = "sk-alice-0123456789abcdef"
ROUTES = {"convo": {"hosts": ["a"]}}
KEYS = {"alice": {"secret": ALICE, "routes": ["convo"]}}


@pytest_twisted.async_yield_fixture
async def crossbar():
    running = await start_crossbar(await start_fakes("a"), ROUTES, keys=KEYS)
    yield running
    await running.stop()


@pytest_twisted.async_yield_fixture
async def admin(crossbar):
    """(status, JSON) of one call to the admin API of `crossbar`."""
    url, port = listen_admin(crossbar)

    async def admin_call(method: str, path: str) -> tuple[int, dict]:
        response = await wait(crossbar.client().request(method, url + path))
        return response.code, json.loads(await wait(response.content()))

    yield admin_call
    await port.stopListening()


# -- the estimate ---------------------------------------------------------------------------


def counted(row, done=0, failed=0, running=0):
    pending = row.total - done - failed - running
    return evolve(row, counts=Counts(pending, running, done, failed))


def test_the_eta_carries_the_pace_so_far_over_the_items_left():
    row = batch_row("b", started=1000.0, total=100)
    # 20 items ended in the first 50 s: 80 left at 0.4 a second.
    assert eta_seconds(counted(row, done=15, failed=5), now=1050.0) == 200.0
    # Failed items are ended items: the pace counts them as it counts answers.
    assert eta_seconds(counted(row, failed=20), now=1050.0) == 200.0
    # Items running are not ended yet.
    assert eta_seconds(counted(row, done=20, running=30), now=1050.0) == 200.0
    assert eta_seconds(counted(row, done=100), now=1100.0) == 0.0


@pytest.mark.parametrize(
    "why, row",
    [
        ("no item has ended yet", counted(batch_row("b", started=1000.0), running=2)),
        ("it has ended", evolve(counted(batch_row("b"), done=4), status="completed")),
        ("it was cancelled", evolve(counted(batch_row("b"), failed=4), status="cancelled")),
        ("it never went in progress", evolve(batch_row("b", started=0.0), status="failed")),
    ],
)
def test_there_is_no_eta_before_an_item_ended_nor_after_the_batch_did(why, row):
    assert eta_seconds(row, now=2000.0) is None, why


def test_a_batch_is_openais_object_with_whose_it_is_its_progress_items_and_tokens():
    row = counted(batch_row("batch_1", "convo", "alice", total=10, started=1000.0), 4, 1, 2)
    row = evolve(row, counts=evolve(row.counts, prompt_tokens=900, cached_tokens=300,
                                    completion_tokens=50))  # fmt: skip
    view = batch_view(row, now=1010.0)
    assert view["object"] == "batch" and view["status"] == "in_progress"
    assert view["request_counts"] == {"total": 10, "completed": 4, "failed": 1}
    assert (view["route"], view["key"]) == ("convo", "alice")
    assert view["progress"] == {"ended": 5, "total": 10}
    assert view["items"] == {"pending": 3, "running": 2, "done": 4, "failed": 1}
    assert view["tokens"] == {"prompt": 900, "cached": 300, "completion": 50}
    assert view["eta_seconds"] == 10.0


# -- over HTTP ------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_every_route_and_keys_batches_newest_first_filtered_by_status_a_page_at_a_time(
    crossbar, admin
):
    store = crossbar.parts.store
    for i, (route, key) in enumerate([("convo", ""), ("bulk", "alice"), ("convo", "alice")]):
        await add_batch(store, batch_row(f"batch_{i}", route, key, created=1000.0 + i))
    await end_items(store, "batch_0", done=1, failed=1)
    await store.cancel_batch("batch_1", 1500.0, not_run_line)

    code, answer = await admin("GET", "/api/batches")
    assert code == 200 and answer["next"] is None
    batches = answer["batches"]
    assert [(b["id"], b["route"], b["key"], b["status"]) for b in batches] == [
        ("batch_2", "convo", "alice", "in_progress"),
        ("batch_1", "bulk", "alice", "cancelling"),
        ("batch_0", "convo", "", "in_progress"),
    ]
    assert batches[2]["progress"] == {"ended": 2, "total": 4}
    assert batches[2]["eta_seconds"] is not None and batches[0]["eta_seconds"] is None

    (first,) = (await admin("GET", "/api/batches?limit=1"))[1]["batches"]
    code, page = await admin("GET", f"/api/batches?limit=1&after={first['id']}")
    assert [b["id"] for b in page["batches"]] == ["batch_1"] and page["next"] == "batch_1"
    _, rest = await admin("GET", "/api/batches?limit=2&after=batch_1")
    assert [b["id"] for b in rest["batches"]] == ["batch_0"] and rest["next"] is None

    for query, ids in [
        ("status=in_progress", ["batch_2", "batch_0"]),
        ("status=cancelling", ["batch_1"]),
        ("status=completed", []),
        ("route=convo", ["batch_2", "batch_0"]),
        ("key=alice", ["batch_2", "batch_1"]),
        ("route=convo&key=alice&status=in_progress", ["batch_2"]),
    ]:
        _, answer = await admin("GET", f"/api/batches?{query}")
        assert [b["id"] for b in answer["batches"]] == ids, query

    code, answer = await admin("GET", "/api/batches?status=running")
    assert code == 400 and "status: must be one of validating, in_progress" in str(answer)
    code, answer = await admin("GET", "/api/batches?limit=0")
    assert code == 400 and "limit" in answer["error"]["message"]


@pytest_twisted.ensureDeferred
async def test_a_batch_run_by_a_client_shows_its_tokens_and_its_events_newest_first(
    crossbar, admin
):
    batch_id = await submit(client(crossbar, key=ALICE), 3)
    await run_to_end(crossbar, batch_id)

    code, batch = await admin("GET", f"/api/batches/{batch_id}")
    assert code == 200
    assert (batch["route"], batch["key"], batch["status"]) == ("convo", "alice", "completed")
    assert batch["progress"] == {"ended": 3, "total": 3} and batch["eta_seconds"] is None
    assert batch["tokens"]["prompt"] > 0 and batch["tokens"]["completion"] > 0
    assert batch["tokens"]["prompt"] == batch["usage"]["input_tokens"]
    assert [e["status"] for e in batch["events"]] == ["completed", "finalizing", "in_progress"]
    assert batch["events"][0]["detail"] == "3 answered, 0 in the error file"
    _, one = await admin("GET", f"/api/batches/{batch_id}?limit=1")
    assert [e["status"] for e in one["events"]] == ["completed"]

    code, answer = await admin("GET", "/api/batches/batch_none")
    assert code == 404 and answer["error"]["message"] == "no batch 'batch_none'"


@pytest_twisted.ensureDeferred
async def test_the_operators_cancel_is_the_clients_own(crossbar, admin):
    store, oai = crossbar.parts.store, client(crossbar)
    await add_batch(store, batch_row("batch_x", "convo", "", created=reactor.seconds(), total=4))

    code, batch = await admin("POST", "/api/batches/batch_x/cancel")
    assert code == 200 and batch["status"] == "cancelling"
    assert batch["progress"] == {"ended": 4, "total": 4}
    assert batch["items"] == {"pending": 0, "running": 0, "done": 0, "failed": 4}
    # The client sees its batch cancelling, then cancelled once the runner finalizes it, its
    # requests not run in its error file.
    assert (await call(lambda: oai.batches.retrieve("batch_x"))).status == "cancelling"
    await crossbar.parts.batches.tick()
    seen = await call(lambda: oai.batches.retrieve("batch_x"))
    assert seen.status == "cancelled" and seen.request_counts.failed == 4
    errors = (await call(lambda: oai.files.content(seen.error_file_id))).text.splitlines()
    assert [json.loads(line)["error"]["code"] for line in errors] == ["batch_cancelled"] * 4
    _, batch = await admin("GET", "/api/batches/batch_x")
    assert [e["status"] for e in batch["events"]] == [
        "cancelled", "finalizing", "cancelling", "in_progress",
    ]  # fmt: skip

    # An ended batch is left as it is; no batch is a 404.
    code, batch = await admin("POST", "/api/batches/batch_x/cancel")
    assert (code, batch["status"]) == (200, "cancelled")
    code, answer = await admin("POST", "/api/batches/batch_none/cancel")
    assert code == 404 and answer["error"]["type"] == "not_found_error"
