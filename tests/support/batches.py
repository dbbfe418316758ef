"""Batches for the operator's stories: made straight in the store (their times and item states
chosen), or submitted as a client does with the official `openai` client and run by ticking the
runner by hand."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import openai
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from crossbar.store import BATCH_ENDED, BatchRow, Ended, NewItem, Store
from tests.support.harness import MODEL, Crossbar, until, wait


def batch_row(
    batch_id: str, route: str = "convo", key: str = "", status: str = "in_progress",
    created: float = 1000.0, started: float | None = None, total: int = 4,
) -> BatchRow:  # fmt: skip
    """A batch as the desk stores it; `started` its in_progress_at (default: `created`)."""
    return BatchRow(
        batch_id, route, key, "/v1/chat/completions", "file-in", "24h", status, created,
        created + 86400, created if started is None else started, 0, 0, 0, 0, 0, 0, "", "", "",
        "", total,
    )  # fmt: skip


async def add_batch(store: Store, row: BatchRow) -> BatchRow:
    """Store `row` with its `total` items, all pending."""
    items = [NewItem(i, f"req-{i}", "", "{}") for i in range(row.total)]
    await store.create_batch(row, items)
    return row


async def end_items(
    store: Store, batch_id: str, done: int = 0, failed: int = 0, now: float = 2000.0,
    tokens: tuple[int, int, int] = (100, 40, 10),
) -> None:  # fmt: skip
    """Claim and end the first `done` + `failed` runnable items (of the oldest batches first,
    so make `batch_id` the only one in progress or the oldest): `done` answered with `tokens`
    (prompt, cached, completion) each, then `failed`."""
    claims = await store.claim_items("tests", now, now + 60, done + failed)
    assert [c.batch for c in claims] == [batch_id] * (done + failed)
    ends = [
        Ended(c.batch, c.line, "done", "{}", *tokens) if i < done
        else Ended(c.batch, c.line, "failed", "{}")
        for i, c in enumerate(claims)
    ]  # fmt: skip
    assert await store.end_items("tests", ends) == [True] * len(ends)


# -- as a client ----------------------------------------------------------------------------


def client(crossbar: Crossbar, route: str = "convo", key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=crossbar.url(route, "/v1"), api_key=key, max_retries=0)


async def call(fn: Callable[[], Any]) -> Any:
    """The openai client's blocking call, in a thread while the reactor serves crossbar."""
    return await wait(deferToThread(fn), 60)


def request_lines(n: int, systems: int = 2, **body: Any) -> bytes:
    """A batch input file of `n` chat requests (custom_ids req-0...), under `systems` system
    prompts taken in turn; `body` adds to or replaces each body's fields."""
    out = []
    for i in range(n):
        messages = [
            {"role": "system", "content": f"You label tickets, style {i % systems}."},
            {"role": "user", "content": f"ticket {i}: the printer is on fire"},
        ]
        line = {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions"}
        fields = {"model": MODEL, "messages": messages, "max_tokens": 8, **body}
        out.append(json.dumps({**line, "body": fields}))
    return ("\n".join(out) + "\n").encode()


async def submit(oai: openai.OpenAI, n: int) -> str:
    """Upload `n` request lines and create their batch; its id."""
    lines = io.BytesIO(request_lines(n))
    uploaded = await call(lambda: oai.files.create(file=("t.jsonl", lines), purpose="batch"))
    batch = await call(
        lambda: oai.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    )
    return batch.id


async def run_to_end(crossbar: Crossbar, batch_id: str) -> BatchRow:
    """Tick the runner until the batch ends; the batch as the store then has it."""
    runner, store = crossbar.parts.batches, crossbar.parts.store
    for _ in range(200):
        await runner.tick()
        row = await store.read_batch(batch_id)
        if row is not None and row.status in BATCH_ENDED:
            return row
        await until(lambda: runner.in_flight == 0, 10)
    raise AssertionError("the batch never ended")


async def ended(store: Store, batch_id: str, deadline: float = 30.0) -> BatchRow:
    """The batch once a running service's own runner has ended it (its timer ticks each
    second), checked every 50 ms until `deadline`."""
    for _ in range(int(deadline / 0.05)):
        row = await store.read_batch(batch_id)
        if row is not None and row.status in BATCH_ENDED:
            return row
        await deferLater(reactor, 0.05, lambda: None)
    raise AssertionError("the batch never ended")


def listen_admin(crossbar: Crossbar) -> tuple[str, Any]:
    """The admin site of `crossbar` on a port of its own: (its URL, the port to stop)."""
    port = reactor.listenTCP(0, crossbar.sites.admin, interface="127.0.0.1")
    return f"http://127.0.0.1:{port.getHost().port}", port
