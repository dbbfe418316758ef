"""Input files checked as OpenAI checks them, told through the official `openai` client: each
kind of bad line is refused with its line number, at upload or when the batch is created; a
file belongs to its route and key; files are listed, read and deleted."""

from __future__ import annotations

import io
import json
from typing import Any

import openai
import pytest
import pytest_twisted
from twisted.internet.defer import Deferred

from tests.support.batches import call, client, request_lines
from tests.support.harness import MODEL, Crossbar, start_crossbar, start_fakes

CHAT = "/v1/chat/completions"


def line(custom_id: Any = "a", method: Any = "POST", url: Any = CHAT, **body: Any) -> str:
    value = {
        "custom_id": custom_id,
        "method": method,
        "url": url,
        "body": body or {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    }
    return json.dumps(value)  # fmt: skip


def good(custom_id: str) -> str:
    return line(custom_id)


BAD_LINES = [
    ("not JSON", "{nope", "invalid_json_line"),
    ("not an object", "[1, 2]", "invalid_request"),
    ("no custom_id", json.dumps({"method": "POST", "url": CHAT, "body": {}}), "missing_custom_id"),
    ("a GET", line("x", method="GET"), "invalid_method"),
    ("an unknown url", line("x", url="/v1/images/generations"), "invalid_url"),
    ("a body that is no object",
     json.dumps({"custom_id": "x", "method": "POST", "url": CHAT, "body": "hi"}), "invalid_body"),
    ("a streamed body", line("x", model=MODEL, messages=[], stream=True), "invalid_body"),
    ("an empty line", "", "empty_line"),
    ("a second url", line("x", url="/v1/completions", model=MODEL, prompt="p"), "mismatched_url"),
    ("a repeated custom_id", good("a"), "duplicate_custom_id"),
]  # fmt: skip


@pytest.fixture
def crossbar() -> Any:
    async def start() -> Crossbar:
        fakes = await start_fakes("a")
        keys = {"alice": {"secret": "sk-alice-0123456789ab", "models": [MODEL]},
                "bob": {"secret": "sk-bob-0123456789abcd"}}  # fmt: skip
        return await start_crossbar(
            fakes,
            {"convo": {"hosts": ["a"]}, "other": {"hosts": ["a"]}},
            server={"batch_max_file": "6KiB", "batch_max_requests": 20, "max_body": "8KiB"},
            keys=keys,
        )  # fmt: skip

    running = pytest_twisted.blockon(Deferred.fromCoroutine(start()))
    yield running
    pytest_twisted.blockon(Deferred.fromCoroutine(running.stop()))


def upload(oai: openai.OpenAI, content: bytes, purpose: str = "batch") -> Any:
    return oai.files.create(file=("in.jsonl", io.BytesIO(content)), purpose=purpose)  # type: ignore[arg-type]


@pytest.mark.parametrize(("what", "bad", "code"), BAD_LINES, ids=[b[0] for b in BAD_LINES])
@pytest_twisted.ensureDeferred
async def test_each_kind_of_bad_line_is_refused_with_its_line_number(
    crossbar: Crossbar, what: str, bad: str, code: str
) -> None:
    oai = client(crossbar)
    content = "\n".join([good("a"), bad, good("c")]) + "\n"
    with pytest.raises(openai.BadRequestError) as refused:
        await call(lambda: upload(oai, content.encode()))
    message = refused.value.body["message"]  # type: ignore[index]
    assert "line 2: " in message and f"({code})" in message, message
    assert refused.value.code == "invalid_file"


@pytest_twisted.ensureDeferred
async def test_every_bad_line_is_reported_not_only_the_first(crossbar: Crossbar) -> None:
    oai = client(crossbar)
    content = "\n".join([good("a"), "{", good("b"), line("c", method="PUT"), good("a")])
    with pytest.raises(openai.BadRequestError) as refused:
        await call(lambda: upload(oai, content.encode()))
    message = refused.value.body["message"]  # type: ignore[index]
    assert "line 2:" in message and "line 4:" in message and "line 5:" in message


@pytest_twisted.ensureDeferred
async def test_limits_are_refused_with_the_key_that_sets_them(crossbar: Crossbar) -> None:
    oai = client(crossbar)
    with pytest.raises(openai.BadRequestError, match="at most 20 requests"):
        await call(lambda: upload(oai, request_lines(21)))
    with pytest.raises(openai.APIStatusError, match="batch_max_file") as large:
        await call(lambda: upload(oai, b"x" * 7000))
    assert large.value.status_code == 413
    with pytest.raises(openai.APIStatusError, match="larger than this server's limit") as body:
        await call(lambda: upload(oai, b"x" * 9000))  # max_body bounds every upload first
    assert body.value.status_code == 413
    with pytest.raises(openai.BadRequestError, match="not UTF-8"):
        await call(lambda: upload(oai, b"\xff\xfe" + good("a").encode()))
    with pytest.raises(openai.BadRequestError, match="purpose must be 'batch'"):
        await call(lambda: upload(oai, good("a").encode(), purpose="fine-tune"))


@pytest_twisted.ensureDeferred
async def test_a_batch_whose_lines_do_not_fit_its_endpoint_or_route_fails_with_their_lines(
    crossbar: Crossbar,
) -> None:
    oai = client(crossbar, key="sk-alice-0123456789ab")
    lines = [good("a"), line("b", model="other-model", messages=[])]
    file = await call(lambda: upload(oai, "\n".join(lines).encode()))
    batch = await call(lambda: oai.batches.create(
        input_file_id=file.id, endpoint="/v1/completions", completion_window="24h"))  # fmt: skip
    assert batch.status == "failed" and batch.failed_at
    assert {(e.line, e.code) for e in batch.errors.data} == {(1, "invalid_url"), (2, "invalid_url")}
    batch = await call(lambda: oai.batches.create(
        input_file_id=file.id, endpoint=CHAT, completion_window="24h"))  # fmt: skip
    assert batch.status == "failed"
    assert [(e.line, e.code) for e in batch.errors.data] == [(2, "model_not_found")]
    assert batch.request_counts.total == 0


@pytest_twisted.ensureDeferred
async def test_a_batch_asks_for_what_openai_asks(crossbar: Crossbar) -> None:
    oai = client(crossbar)
    file = await call(lambda: upload(oai, good("a").encode()))
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        await call(lambda: oai.batches.create(
            input_file_id=file.id, endpoint=CHAT, completion_window="1h"))  # type: ignore[arg-type]  # fmt: skip
    with pytest.raises(openai.BadRequestError, match="endpoint must be one of"):
        await call(lambda: oai.batches.create(
            input_file_id=file.id, endpoint="/v1/moderations", completion_window="24h"))  # type: ignore[arg-type]  # fmt: skip
    with pytest.raises(openai.NotFoundError):
        await call(lambda: oai.batches.create(
            input_file_id="file-nope", endpoint=CHAT, completion_window="24h"))  # fmt: skip


@pytest_twisted.ensureDeferred
async def test_a_file_belongs_to_its_route_and_key(crossbar: Crossbar) -> None:
    alice, bob = (
        client(crossbar, key="sk-alice-0123456789ab"),
        client(crossbar, key="sk-bob-0123456789abcd"),
    )
    file = await call(lambda: upload(alice, good("a").encode()))
    assert [f.id for f in (await call(lambda: alice.files.list())).data] == [file.id]
    assert (await call(lambda: bob.files.list())).data == []
    with pytest.raises(openai.NotFoundError):
        await call(lambda: bob.files.retrieve(file.id))
    with pytest.raises(openai.NotFoundError):
        await call(
            lambda: client(crossbar, "other", "sk-alice-0123456789ab").files.content(file.id)
        )
    text = (await call(lambda: alice.files.content(file.id))).text
    assert json.loads(text)["custom_id"] == "a"
    deleted = await call(lambda: alice.files.delete(file.id))
    assert deleted.deleted is True
    with pytest.raises(openai.NotFoundError):
        await call(lambda: alice.files.retrieve(file.id))


@pytest_twisted.ensureDeferred
async def test_batches_are_listed_newest_first_in_pages(crossbar: Crossbar) -> None:
    oai = client(crossbar)
    file = await call(lambda: upload(oai, good("a").encode()))
    made = []
    for _ in range(3):
        batch = await call(lambda: oai.batches.create(
            input_file_id=file.id, endpoint=CHAT, completion_window="24h"))  # fmt: skip
        made.append(batch.id)
    page = await call(lambda: oai.batches.list(limit=2))
    assert [b.id for b in page.data] == made[::-1][:2] and page.has_more
    rest = await call(lambda: oai.batches.list(limit=2, after=page.data[-1].id))
    assert [b.id for b in rest.data] == made[:1] and not rest.has_more
