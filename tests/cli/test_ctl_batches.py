"""`crossbar ctl batches` against a real crossbar's admin port: every route's and key's batches
in a table, one with its events, a cancel in a sentence."""

import contextlib
import io
import json

import pytest_twisted
from twisted.internet.threads import deferToThread

from crossbar.batches import not_run_line
from crossbar.cli.main import main
from tests.support.batches import (
    add_batch,
    batch_row,
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


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest_twisted.async_yield_fixture
async def crossbar():
    running = await start_crossbar(await start_fakes("a"), ROUTES, keys=KEYS)
    yield running
    await running.stop()


@pytest_twisted.async_yield_fixture
async def ctl(crossbar):
    """(exit status, stdout, stderr) of `crossbar ctl --admin <url> ARGV`, run in a thread
    while the reactor serves the admin port."""
    url, port = listen_admin(crossbar)

    async def run(*argv: str) -> tuple[int, str, str]:
        return await wait(deferToThread(_run, ["ctl", "--admin", url, *argv]), 30)

    yield run
    await port.stopListening()


def cells(line: str) -> list[str]:
    """A table row's cells; CREATED, the last, is two words."""
    return line.split()[:-2]


@pytest_twisted.ensureDeferred
async def test_batches_lists_every_route_and_keys_batches_with_progress_tokens_and_eta(
    crossbar, ctl
):
    store = crossbar.parts.store
    await add_batch(store, batch_row("batch_a", "convo", "", created=1000.0, total=4))
    await end_items(store, "batch_a", done=1, failed=1, tokens=(1200, 0, 30))
    await add_batch(store, batch_row("batch_b", "bulk", "alice", created=1001.0, total=2))
    await store.cancel_batch("batch_b", 1500.0, not_run_line)

    code, out, err = await ctl("batches")
    assert (code, err) == (0, "")
    header, newest, oldest, footer = out.splitlines()
    assert header.split() == [
        "BATCH", "ROUTE", "KEY", "STATUS", "ENDED", "FAILED", "TOKENS_IN", "TOKENS_OUT", "ETA",
        "CREATED",
    ]  # fmt: skip
    assert cells(newest) == ["batch_b", "bulk", "alice", "cancelling", "2/2", "2", "0", "0", "0s"]
    assert cells(oldest)[:8] == ["batch_a", "convo", "-", "in_progress", "2/4", "1", "1,200", "30"]
    assert cells(oldest)[8].endswith("d")  # two ended since 1970: the rest take as long again
    assert footer == "2 batches"

    code, out, _ = await ctl("batches", "--status", "in_progress")
    assert [cells(line)[0] for line in out.splitlines()[1:-1]] == ["batch_a"]
    code, out, _ = await ctl("batches", "--limit", "1")
    assert out.splitlines()[-1] == "1 batches; next page: --after batch_b (or --all)"
    code, out, _ = await ctl("batches", "--after", "batch_b")
    assert [cells(line)[0] for line in out.splitlines()[1:-1]] == ["batch_a"]
    code, out, _ = await ctl("batches", "--limit", "1", "--all")
    assert out.splitlines()[-1] == "2 batches"
    code, out, _ = await ctl("batches", "--key", "alice", "--json")
    assert [b["id"] for b in json.loads(out)["batches"]] == ["batch_b"]


@pytest_twisted.ensureDeferred
async def test_batches_show_tells_a_batches_items_tokens_and_events(crossbar, ctl):
    batch_id = await submit(client(crossbar, key=ALICE), 2)
    await run_to_end(crossbar, batch_id)

    code, out, err = await ctl("batches", "show", batch_id)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert cells(lines[1])[:6] == [batch_id, "convo", "alice", "completed", "2/2", "0"]
    assert lines[3].startswith("/v1/chat/completions, window 24h; files: input file-")
    assert ", output file-" in lines[3] and "error" not in lines[3]
    assert lines[4] == "items: 0 pending, 0 running, 2 done, 0 failed"
    assert lines[5].startswith("tokens: ") and " completion" in lines[5]
    events = lines[7:]
    assert events[0].split() == ["AT", "STATUS", "INSTANCE", "DETAIL"]
    assert [line.split()[2] for line in events[1:]] == ["completed", "finalizing", "in_progress"]
    assert events[1].endswith("2 answered, 0 in the error file")


@pytest_twisted.ensureDeferred
async def test_batches_cancel_says_what_becomes_of_the_requests_and_a_wrong_id_is_one_line(
    crossbar, ctl
):
    await add_batch(crossbar.parts.store, batch_row("batch_x", total=3))
    code, out, err = await ctl("batches", "cancel", "batch_x")
    assert (code, err) == (0, "")
    assert out == (
        "batch batch_x cancelling: its requests not run go to its error file; "
        "0 running finish first\n"
    )
    await crossbar.parts.batches.tick()  # finalized: cancelled
    code, out, _ = await ctl("batches", "cancel", "batch_x")
    assert out == "batch batch_x is cancelled: nothing to cancel\n"
    code, out, err = await ctl("batches", "cancel", "batch_none")
    assert (code, out, err) == (1, "", "crossbar ctl: 404: no batch 'batch_none'\n")
    code, out, err = await ctl("batches", "show", "batch_none")
    assert (code, err) == (1, "crossbar ctl: 404: no batch 'batch_none'\n")
