"""The runner's rules told on a Clock: what each answer means for an item (tried again, ended in
the error file, kept), claims that run out and go to another instance, the completion window,
cancelling, a clean stop. The proxy is a stand-in that hands each item to the story, which
answers it; the store is a real one (SQLite in memory)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from crossbar.batches import BatchDesk, BatchRunner
from crossbar.batches.desk import WINDOW
from crossbar.config.values import parse_config
from crossbar.proxy import InsideAnswer, InsideRequest
from crossbar.store import Store
from crossbar.wire import RawHeaders

MODEL = "qwen-coder"


class Served:
    """`hosts.serving(route)`: the one model every route serves here."""

    models = [MODEL]


class Hosts:
    def serving(self, route: Any) -> Served:
        return Served()


class Proxy:
    """The proxy as the runner sees it: each item waits here until the story answers it."""

    def __init__(self) -> None:
        self.waiting: list[tuple[InsideRequest, Deferred[InsideAnswer]]] = []

    def __call__(self, request: InsideRequest) -> Deferred[InsideAnswer]:
        d = request.answered  # as the proxy's: an aborted item fails it
        self.waiting.append((request, d))
        return d

    def custom_ids(self) -> list[str]:
        return [json.loads(r.body)["messages"][0]["content"] for r, _ in self.waiting]

    def answer(
        self, status: int, body: Any, headers: dict[bytes, bytes] | None = None, index: int = 0
    ) -> None:
        """Answer the oldest waiting item (or the one at `index`)."""
        _, d = self.waiting.pop(index)
        raw = RawHeaders([(k, v) for k, v in (headers or {}).items()])
        d.callback(InsideAnswer(status, raw, json.dumps(body).encode()))

    def cut(self) -> None:
        _, d = self.waiting.pop(0)
        d.callback(InsideAnswer(200, RawHeaders(), b'{"choi', cut=True))


def ok(n: int = 3) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "choices": [{"message": {"content": "fine"}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": n}}  # fmt: skip


def refused(message: str) -> dict[str, Any]:
    return {"error": {"code": 429, "type": "rate_limit_error", "message": message}}


class Story:
    def __init__(self, store: Store, clock: Clock, **server: Any) -> None:
        self.clock = clock
        self.store = store
        self.config = parse_config(
            {
                "server": {"db": ":memory:", "batch_in_flight": 1, "batch_retries": 2,
                           "batch_claim_timeout": "30s", **server},
                "hosts": {"a": {"url": "http://a:8080", "models": [MODEL]}},
                "routes": {"convo": {"hosts": ["a"]}},
            }
        )  # fmt: skip
        self.desk = BatchDesk(self.config, clock, store, Hosts(), off_reactor=_inline)
        self.proxy = Proxy()
        self.runner = self.runner_of(store)

    def runner_of(self, store: Store) -> BatchRunner:
        runner = BatchRunner(self.config, self.clock, store, Hosts())  # type: ignore[arg-type]
        runner.inside = self.proxy
        return runner

    async def batch(self, n: int) -> str:
        """A batch of n items created as a client creates one; its id."""
        lines = [
            json.dumps({"custom_id": f"item-{i}", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"model": MODEL,
                                 "messages": [{"role": "user", "content": f"item-{i}"}]}})
            for i in range(n)
        ]  # fmt: skip
        upload = Request.form("\n".join(lines).encode())
        route = self.config.route("convo")
        await self.desk.serve(upload, route, None, "POST", "/v1/files")
        file_id = upload.json()["id"]
        create = Request(json.dumps({"input_file_id": file_id,
                                     "endpoint": "/v1/chat/completions",
                                     "completion_window": "24h"}).encode())  # fmt: skip
        await self.desk.serve(create, route, None, "POST", "/v1/batches")
        return str(create.json()["id"])

    async def tick(self, runner: BatchRunner | None = None) -> None:
        runner = runner or self.runner
        await runner.tick()
        await runner.settled()

    async def status(self, batch_id: str) -> str:
        row = await self.store.read_batch(batch_id)
        assert row is not None
        return row.status

    async def lines(self, batch_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        row = await self.store.read_batch(batch_id)
        assert row is not None
        files = []
        for file_id in (row.output_file_id, row.error_file_id):
            text = await self.store.file_content(file_id) if file_id else ""
            files.append([json.loads(line) for line in (text or "").splitlines()])
        return files[0], files[1]


async def _inline(fn: Any, *args: Any) -> Any:
    return fn(*args)


class Request:
    """Just enough of a client request for the desk."""

    def __init__(self, body: bytes, ctype: bytes = b"application/json") -> None:
        self.body = body
        self.uri = b"/"
        self.code = 200
        self.written = b""
        self.responseHeaders = RawHeaders()
        self._ctype = ctype

    @classmethod
    def form(cls, content: bytes) -> Request:
        body = (
            b'--xx\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b'--xx\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
            b"Content-Type: application/jsonl\r\n\r\n" + content + b"\r\n--xx--\r\n"
        )
        return cls(body, b"multipart/form-data; boundary=xx")

    def getHeader(self, name: bytes) -> bytes:
        return self._ctype

    def setResponseCode(self, code: int) -> None:
        self.code = code

    def write(self, data: bytes) -> None:
        self.written += data

    def finish(self) -> None:
        pass

    def json(self) -> Any:
        return json.loads(self.written)


@pytest.fixture
def store_and_clock() -> Iterator[tuple[Store, Clock]]:
    store = pytest_twisted.blockon(Deferred.fromCoroutine(Store.open(":memory:", reactor, "one")))
    yield store, Clock()
    pytest_twisted.blockon(Deferred.fromCoroutine(store.close()))


@pytest.fixture
def story(store_and_clock: tuple[Store, Clock]) -> Story:
    return Story(*store_and_clock)


@pytest_twisted.ensureDeferred
async def test_a_failing_host_is_tried_again_after_a_growing_pause_then_its_answer_is_kept_as_the_error(
    story: Story,
) -> None:
    batch = await story.batch(1)
    await story.tick()
    story.proxy.answer(503, {"error": {"message": "overloaded"}})
    await story.runner.settled()
    await story.tick()
    assert story.proxy.waiting == []  # its pause (2 s) has not passed
    story.clock.advance(2)
    await story.tick()
    story.proxy.answer(500, {"error": {"message": "boom"}})
    await story.runner.settled()
    story.clock.advance(3)
    await story.tick()
    assert story.proxy.waiting == []  # the second pause is 4 s
    story.clock.advance(1)
    await story.tick()
    story.proxy.answer(502, {"error": {"message": "reset"}})  # the last of 1 + 2 retries
    await story.runner.settled()
    await story.tick()
    assert await story.status(batch) == "completed"
    output, errors = await story.lines(batch)
    assert output == []
    assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [("item-0", 502)]
    assert errors[0]["response"]["body"]["error"]["message"] == "reset"


@pytest_twisted.ensureDeferred
async def test_a_cut_answer_is_a_host_failure_too(story: Story) -> None:
    batch = await story.batch(1)
    await story.tick()
    story.proxy.cut()
    await story.runner.settled()
    story.clock.advance(2)
    await story.tick()
    story.proxy.answer(200, ok())
    await story.runner.settled()
    await story.tick()
    output, errors = await story.lines(batch)
    assert [o["custom_id"] for o in output] == ["item-0"] and errors == []


@pytest_twisted.ensureDeferred
async def test_a_client_error_goes_to_the_error_file_at_once(story: Story) -> None:
    batch = await story.batch(2)
    await story.tick()
    story.proxy.answer(400, {"error": {"message": "bad tool schema"}})
    await story.runner.settled()
    await story.tick()  # the next item, no pause
    story.proxy.answer(200, ok())
    await story.runner.settled()
    await story.tick()
    output, errors = await story.lines(batch)
    assert [o["custom_id"] for o in output] == ["item-1"]
    assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [("item-0", 400)]


@pytest_twisted.ensureDeferred
async def test_a_rate_limit_waits_its_retry_after_and_uses_no_attempt(story: Story) -> None:
    batch = await story.batch(1)
    await story.tick()
    for _ in range(5):  # more rate limits than retries: none of them counts
        story.proxy.answer(429, refused("key 'k' is over its limit of 10 a minute (rpm)"),
                           {b"retry-after": b"7"})  # fmt: skip
        await story.runner.settled()
        story.clock.advance(6)
        await story.tick()
        assert story.proxy.waiting == []  # Retry-After says 7 s
        story.clock.advance(1)
        await story.tick()
    story.proxy.answer(200, ok())
    await story.runner.settled()
    await story.tick()
    output, errors = await story.lines(batch)
    assert [o["custom_id"] for o in output] == ["item-0"] and errors == []


@pytest_twisted.ensureDeferred
async def test_a_spent_budget_ends_the_item_at_once(story: Story) -> None:
    batch = await story.batch(2)
    await story.tick()
    story.proxy.answer(200, ok())
    await story.runner.settled()
    await story.tick()
    spent = "key 'k' is over its limit of 1000 tokens a day (tokens_per_day)"
    story.proxy.answer(429, refused(spent))
    await story.runner.settled()
    await story.tick()
    assert await story.status(batch) == "completed"
    output, errors = await story.lines(batch)
    assert [o["custom_id"] for o in output] == ["item-0"]
    assert [e["custom_id"] for e in errors] == ["item-1"]
    assert "tokens_per_day" in errors[0]["response"]["body"]["error"]["message"]


@pytest_twisted.ensureDeferred
async def test_the_completion_window_expires_what_has_not_run_and_keeps_what_did(
    story: Story,
) -> None:
    batch = await story.batch(3)
    await story.tick()
    story.proxy.answer(200, ok())
    await story.runner.settled()
    await story.tick()  # item-1 now runs
    story.clock.advance(WINDOW)
    await story.tick()
    assert await story.status(batch) == "in_progress"  # item-1 still runs: it may finish
    story.proxy.answer(200, ok())
    await story.runner.settled()
    await story.tick()
    assert await story.status(batch) == "expired"
    output, errors = await story.lines(batch)
    assert [o["custom_id"] for o in output] == ["item-0", "item-1"]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("item-2", "batch_expired")]
    row = await story.store.read_batch(batch)
    assert row is not None and row.expired_at == row.created + WINDOW


@pytest_twisted.ensureDeferred
async def test_cancelling_ends_what_has_not_run_and_waits_for_what_runs(story: Story) -> None:
    batch = await story.batch(3)
    await story.tick()
    status = await story.store.cancel_batch(batch, story.clock.seconds(), _not_run)
    assert status == "cancelling"
    await story.tick()
    assert await story.status(batch) == "cancelling"
    story.proxy.answer(200, ok())
    await story.runner.settled()
    await story.tick()
    assert await story.status(batch) == "cancelled"
    output, errors = await story.lines(batch)
    assert [o["custom_id"] for o in output] == ["item-0"]
    assert sorted(e["custom_id"] for e in errors) == ["item-1", "item-2"]
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}


def _not_run(custom_id: str, ending: str) -> str:
    from crossbar.batches.objects import not_run_line

    return not_run_line(custom_id, ending)


@pytest_twisted.ensureDeferred
async def test_claims_that_run_out_go_to_another_instance_and_one_result_is_kept(
    story: Story,
) -> None:
    batch = await story.batch(2)
    first = story.runner
    await story.tick(first)
    assert story.proxy.custom_ids() == ["item-0"]
    # The first instance is cut off: it renews nothing for the claim timeout.
    second = story.runner_of(story.store)
    await story.tick(second)
    assert story.proxy.custom_ids() == ["item-0", "item-1"]  # item-0 is still the first's
    story.proxy.answer(200, ok(), index=1)  # item-1, the second's
    await second.settled()
    story.clock.advance(31)
    await story.tick(second)
    assert story.proxy.custom_ids() == ["item-0", "item-0"]  # the first's claim ran out
    story.proxy.answer(200, ok())  # the first instance's item-0, answered late
    await first.settled()
    assert first.outcomes["lost"] == 1  # its claim went to the second instance
    story.proxy.answer(200, ok())  # item-0 again, the second's
    await second.settled()
    await story.tick(second)
    output, errors = await story.lines(batch)
    assert sorted(o["custom_id"] for o in output) == ["item-0", "item-1"] and errors == []


@pytest_twisted.ensureDeferred
async def test_a_live_instance_renews_its_claims(story: Story) -> None:
    await story.batch(1)
    await story.tick()
    second = story.runner_of(story.store)
    for _ in range(4):  # 40 s, past the 30 s timeout, renewed every 10 s
        story.clock.advance(10)
        await story.tick()
        await story.tick(second)
    assert story.proxy.custom_ids() == ["item-0"]


@pytest_twisted.ensureDeferred
async def test_a_clean_stop_gives_its_claims_back_at_once(story: Story) -> None:
    batch = await story.batch(1)
    await story.tick()
    await story.runner.stop()
    second = story.runner_of(story.store)
    await story.tick(second)
    assert len(story.proxy.waiting) == 2  # the stopped one's (aborted) and the second's
    stopped, _ = story.proxy.waiting.pop(0)
    assert stopped.finished  # aborted by the stop
    story.proxy.answer(200, ok())
    await second.settled()
    await story.tick(second)
    output, _ = await story.lines(batch)
    assert [o["custom_id"] for o in output] == ["item-0"]


@pytest_twisted.ensureDeferred
async def test_ended_batches_and_their_files_are_pruned_after_the_retention(story: Story) -> None:
    ended = await story.batch(1)
    await story.tick()
    story.proxy.answer(200, ok())
    await story.runner.settled()
    await story.tick()
    row = await story.store.read_batch(ended)
    assert row is not None and row.status == "completed"
    story.clock.advance(20 * 86400)
    running = await story.batch(1)  # its input file is young, and read while it runs
    story.clock.advance(11 * 86400)  # past the 30 d retention of the first, not the second
    await story.tick()
    assert await story.store.read_batch(ended) is None
    assert await story.store.file_content(row.output_file_id) is None
    assert await story.store.file_content(row.input_file_id) is None
    assert await story.status(running) in ("in_progress", "expired")


@pytest_twisted.ensureDeferred
async def test_by_default_items_start_as_the_hosts_batch_room_allows_and_one_waits_when_none(
    store_and_clock: tuple[Store, Clock],
) -> None:
    story = Story(*store_and_clock, batch_in_flight=0)
    room = [0]
    story.runner.spare = lambda: room[0]
    await story.batch(5)
    await story.tick()
    assert len(story.proxy.waiting) == 1  # no room anywhere: one waits its turn (and ages)
    await story.tick()
    assert len(story.proxy.waiting) == 1  # and no more join it
    room[0] = 3
    await story.tick()
    assert len(story.proxy.waiting) == 4  # three more, where the caps let them start now
    room[0] = 0
    story.proxy.answer(200, ok())
    await story.runner.settled()
    assert len(story.proxy.waiting) == 3  # the slot it freed is people's again: none claimed


@pytest_twisted.ensureDeferred
async def test_an_ended_batch_keeps_its_counts_and_reading_it_counts_no_items(
    story: Story,
) -> None:
    batch = await story.batch(2)
    for _ in range(2):
        await story.tick()
        story.proxy.answer(200, ok(5))
        await story.runner.settled()
    await story.tick()
    ended = await story.store.read_batch(batch)
    assert ended is not None and ended.status == "completed"
    assert (ended.counts.done, ended.counts.completion_tokens) == (2, 10)
    # Its items are no longer read: the counts it keeps are what it shows.
    await story.store._run("", lambda txn: txn.execute("DELETE FROM batch_items"))
    again = await story.store.read_batch(batch)
    assert again is not None and again.counts == ended.counts
    listed = await story.store.list_batches("convo", "", "", 10)
    assert [b.counts for b in listed] == [ended.counts]
