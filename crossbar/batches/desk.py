"""The Batch API's paths on the client port (docs/reference.md, "Batches"): files uploaded,
listed, read and deleted; batches created, listed, read and cancelled. Each is the route's and
the key's that made it: another route or key finds nothing there (404).

A batch is checked whole when it is created: it either starts `in_progress` with every line
stored as an item, or ends `failed` at once with its line errors, as OpenAI's does after
`validating`. The runner (runner.py) does the rest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from twisted.internet.interfaces import IReactorTime
from twisted.internet.threads import deferToThread
from twisted.logger import Logger

from crossbar.batches import lines as checks
from crossbar.batches.multipart import FormError, parse_form
from crossbar.batches.objects import batch_object, file_object, new_id, not_run_line
from crossbar.config import Config, Route
from crossbar.hosts import Hosts
from crossbar.proxy import choose_model, system_digest
from crossbar.store import BatchRow, FileRow, NewItem, Store, StoreError
from crossbar.tenants import ClientKey
from crossbar.wire import ClientError, bad_request, classify, not_found, unavailable

log = Logger(namespace="crossbar.batches")

WINDOW = 24 * 3600.0  # the one completion window OpenAI offers, "24h"
MAX_METADATA = 16  # metadata pairs, as OpenAI allows
_FILE = re.compile(r"/v1/files/([^/]+)(/content)?")
_BATCH = re.compile(r"/v1/batches/([^/]+)(/cancel)?")
_LIMIT = (1, 100)  # a list page's size, as OpenAI's `limit` (files: 10000)

OffReactor = Callable[..., Awaitable[Any]]


def _send(request: Any, body: bytes, ctype: bytes = b"application/json") -> int:
    request.setResponseCode(200)
    request.responseHeaders.setRawHeaders(b"content-type", [ctype])
    request.responseHeaders.setRawHeaders(b"content-length", [str(len(body)).encode()])
    request.write(body)
    request.finish()
    return 200


def _answer(request: Any, obj: Any) -> int:
    return _send(request, json.dumps(obj).encode())


def _owned(row: Any, route: Route, owner: str, what: str, id_: str) -> Any:
    """`row` when it is `route`'s and `owner`'s; else 404, as for no such thing."""
    if row is None or row.route != route.name or row.key != owner:
        raise not_found(f"no {what} {id_!r} on route {route.name!r}")
    return row


def _query(request: Any) -> dict[str, str]:
    uri = request.uri.decode("utf-8", "replace")
    found = parse_qs(uri.partition("?")[2])
    return {name: values[-1] for name, values in found.items()}


def _limit(query: dict[str, str], default: int, most: int) -> int:
    raw = query.get("limit", "")
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(f"limit must be an integer, not {raw!r}") from None
    if not 1 <= value <= most:
        raise bad_request(f"limit must be between 1 and {most}, not {value}")
    return value


def _listed(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


class BatchDesk:
    """The Batch API's files and batches on the client port (the proxy's `BatchFront`)."""

    def __init__(
        self,
        config: Config,
        clock: IReactorTime,
        store: Store,
        hosts: Hosts,
        off_reactor: OffReactor = deferToThread,
    ) -> None:
        """`off_reactor` runs a large file's check in a thread (tests may run it inline)."""
        self._config = config
        self._clock = clock
        self._store = store
        self._hosts = hosts
        self._off = off_reactor
        self.created: list[Callable[[str], None]] = []  # told each batch that starts

    def reconfigure(self, config: Config) -> None:
        self._config = config

    async def serve(
        self, request: Any, route: Route, key: ClientKey | None, method: str, path: str
    ) -> int:
        """Answer one Batch API request of `route` and `key` (the proxy's `BatchFront`)."""
        owner = key.name if key is not None else ""
        try:
            return await self._serve(request, route, owner, key, method, path)
        except StoreError as e:
            log.warn("batch API: {error}", error=str(e))
            raise unavailable("crossbar's store cannot be reached now; try again", 5) from None

    async def _serve(
        self, request: Any, route: Route, owner: str, key: ClientKey | None, method: str,
        path: str,
    ) -> int:  # fmt: skip
        if path == "/v1/files":
            if method == "POST":
                return _answer(request, await self._upload(request, route, owner))
            if method == "GET":
                return _answer(request, await self._files(request, route, owner))
            raise _not_allowed(method, path)
        if path == "/v1/batches":
            if method == "POST":
                return _answer(request, await self._create(request, route, owner, key))
            if method == "GET":
                return _answer(request, await self._batches(request, route, owner))
            raise _not_allowed(method, path)
        found = _FILE.fullmatch(path)
        if found is not None:
            file_id, content = found.group(1), found.group(2)
            row = await self._own_file(file_id, route, owner)
            if content:
                if method != "GET":
                    raise _not_allowed(method, path)
                return await self._content(request, row)
            if method == "GET":
                return _answer(request, file_object(row))
            if method == "DELETE":
                await self._store.delete_file(row.id)
                return _answer(request, {"id": row.id, "object": "file", "deleted": True})
            raise _not_allowed(method, path)
        found = _BATCH.fullmatch(path)
        if found is not None:
            batch = await self._own_batch(found.group(1), route, owner)
            if found.group(2):
                if method != "POST":
                    raise _not_allowed(method, path)
                return _answer(request, await self._cancel(batch))
            if method != "GET":
                raise _not_allowed(method, path)
            return _answer(request, batch_object(batch))
        raise not_found(f"crossbar does not serve {method} {path}")

    # -- files

    async def _upload(self, request: Any, route: Route, owner: str) -> dict[str, Any]:
        s = self._config.server
        body = request.body
        if len(body) > s.batch_max_file + 64 * 1024:  # the form's own bytes beside the file
            raise _too_large(len(body), s.batch_max_file)
        ctype = request.getHeader(b"content-type")
        try:
            form = parse_form(ctype.decode("latin-1") if ctype else "", body)
        except FormError as e:
            raise bad_request(str(e)) from None
        purpose = form.get("purpose")
        file = form.get("file")
        if file is None:
            raise bad_request("the form has no file: send it as the field 'file'", "missing_file")
        said = purpose.content.decode("utf-8", "replace").strip() if purpose else ""
        if said != "batch":
            raise bad_request(
                f"crossbar keeps files for batches only: purpose must be 'batch', not {said!r}",
                "invalid_purpose",
            )
        if len(file.content) > s.batch_max_file:
            raise _too_large(len(file.content), s.batch_max_file)
        checked = await self._check(file.content)
        if not checked.ok:
            raise _bad_lines(checked.errors)
        row = FileRow(
            new_id("file-"), route.name, owner, "batch", _filename(file.filename),
            len(file.content), len(checked.lines), self._clock.seconds(),
        )  # fmt: skip
        await self._store.add_file(row, file.content.decode("utf-8"))
        log.info(
            "file {id} uploaded on route {route}: {lines} requests, {size} bytes",
            id=row.id, route=route.name, lines=row.lines, size=row.bytes,
        )  # fmt: skip
        return file_object(row)

    async def _check(self, content: bytes) -> checks.Checked:
        s = self._config.server
        if len(content) < 256 * 1024:  # small: at once, on the reactor
            return checks.check_file(content, s.batch_max_requests)
        result: checks.Checked = await self._off(checks.check_file, content, s.batch_max_requests)
        return result

    async def _files(self, request: Any, route: Route, owner: str) -> dict[str, Any]:
        query = _query(request)
        limit = _limit(query, 100, 10_000)
        rows = await self._store.list_files(
            route.name, owner, query.get("purpose", ""), query.get("after", ""), limit + 1
        )
        return _listed([file_object(r) for r in rows[:limit]], len(rows) > limit)

    async def _own_file(self, file_id: str, route: Route, owner: str) -> FileRow:
        row = await self._store.read_file(file_id)
        found: FileRow = _owned(row, route, owner, "file", file_id)
        return found

    async def _content(self, request: Any, row: FileRow) -> int:
        text = await self._store.file_content(row.id)
        if text is None:
            raise not_found(f"no file {row.id!r}")
        return _send(request, text.encode("utf-8"), b"application/jsonl")

    # -- batches

    async def _create(
        self, request: Any, route: Route, owner: str, key: ClientKey | None
    ) -> dict[str, Any]:
        try:
            asked = json.loads(request.body or b"null")
        except ValueError:
            raise bad_request("the body is not JSON") from None
        if not isinstance(asked, dict):
            raise bad_request("the body must be a JSON object")
        file_id = asked.get("input_file_id")
        if not isinstance(file_id, str) or not file_id:
            raise bad_request("input_file_id is required", "missing_required_parameter")
        endpoint = asked.get("endpoint")
        if endpoint not in checks.ENDPOINTS:
            raise bad_request(
                f"endpoint must be one of {', '.join(checks.ENDPOINTS)}, not {endpoint!r}",
                "invalid_endpoint",
            )
        window = asked.get("completion_window", "24h")
        if window != "24h":
            raise bad_request(f"completion_window must be '24h', not {window!r}", "invalid_value")
        metadata = _metadata(asked.get("metadata"))
        file = await self._own_file(file_id, route, owner)
        text = await self._store.file_content(file.id)
        assert text is not None
        checked = await self._check(text.encode("utf-8"))
        served = self._hosts.serving(route).models
        checked = checks.check_batch(checked, endpoint, partial_model(route, served, key))
        now = self._clock.seconds()
        ok = checked.ok
        errors = json.dumps([e.to_json() for e in checked.errors]) if not ok else ""
        row = BatchRow(
            new_id("batch_"), route.name, owner, endpoint, file.id, "24h",
            "in_progress" if ok else "failed", now, now + WINDOW,
            now if ok else 0.0, 0.0, 0.0, 0.0 if ok else now, 0.0, 0.0, 0.0, "", "", errors,
            json.dumps(metadata) if metadata is not None else "",
            len(checked.lines) if ok else 0,
        )  # fmt: skip
        dialect = classify("POST", endpoint)[0]
        items = [
            NewItem(
                line.line, line.custom_id, system_digest(line.body, dialect), json.dumps(line.body)
            )
            for line in (checked.lines if ok else ())
        ]
        await self._store.create_batch(row, items)
        log.info(
            "batch {id} on route {route}: {status}, {n} requests to {endpoint}",
            id=row.id, route=route.name, status=row.status, n=row.total, endpoint=endpoint,
        )  # fmt: skip
        if ok:
            for tell in self.created:
                tell(row.id)
        return batch_object(row)

    async def _batches(self, request: Any, route: Route, owner: str) -> dict[str, Any]:
        query = _query(request)
        limit = _limit(query, 20, 100)
        rows = await self._store.list_batches(route.name, owner, query.get("after", ""), limit + 1)
        return _listed([batch_object(r) for r in rows[:limit]], len(rows) > limit)

    async def _own_batch(self, batch_id: str, route: Route, owner: str) -> BatchRow:
        row = await self._store.read_batch(batch_id)
        found: BatchRow = _owned(row, route, owner, "batch", batch_id)
        return found

    async def _cancel(self, batch: BatchRow) -> dict[str, Any]:
        status = await self._store.cancel_batch(batch.id, self._clock.seconds(), not_run_line)
        if status == "cancelling":
            log.info("batch {id} cancelling", id=batch.id)
        row = await self._store.read_batch(batch.id)
        assert row is not None
        return batch_object(row)


def partial_model(
    route: Route, served: list[str], key: ClientKey | None
) -> Callable[[object], str | None]:
    """The rule each line's model must pass: one the route serves now (its aliases and
    `unknown_model` as a request would find them) that the key may use."""

    def error(model: object) -> str | None:
        try:
            found = choose_model(route, served, {"model": model} if model else {}, "")
        except ClientError as e:
            return e.message
        if key is not None and not key.covers_model(found):
            return f"key {key.name!r} may not use model {found!r}"
        return None

    return error


def _metadata(value: object) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA:
        raise bad_request(f"metadata must be an object of at most {MAX_METADATA} pairs")
    for name, item in value.items():
        if not isinstance(item, str) or len(name) > 64 or len(item) > 512:
            raise bad_request("metadata keys are at most 64 characters, values strings of 512")
    return value


def _filename(name: str | None) -> str:
    return (name or "batch.jsonl")[:255]


def _too_large(size: int, most: int) -> ClientError:
    return ClientError(
        413, "invalid_request_error",
        f"the file is {size} bytes; crossbar keeps batch files of at most {most} bytes "
        "(server.batch_max_file)",
        "file_too_large",
    )  # fmt: skip


def _bad_lines(errors: list[checks.LineError]) -> ClientError:
    shown = "; ".join(
        (f"line {e.line}: " if e.line is not None else "") + f"{e.message} ({e.code})"
        for e in errors[:20]
    )
    more = f"; and {len(errors) - 20} more" if len(errors) > 20 else ""
    return bad_request(f"the file is not a valid batch input: {shown}{more}", "invalid_file")


def _not_allowed(method: str, path: str) -> ClientError:
    return ClientError(405, "invalid_request_error", f"{path} does not take {method}")
