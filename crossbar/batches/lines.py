"""An input file's request lines, checked as OpenAI checks them (docs/reference.md, "Batches"):
each line a JSON object with a unique `custom_id`, `method` POST, a `url` that is a batch
endpoint (the same on every line) and a JSON object `body` that does not ask to stream (no body
is larger than the upload that brought it, which `max_body` bounds). What is wrong is reported
by line number, every line's problem, up to `MAX_REPORTED`.

`check_file` is what an upload checks; `check_batch` what creating a batch adds: the lines'
`url` is the batch's endpoint, and each body names a model the route serves that the key may
use.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from attrs import frozen

# The endpoints a batch may run, as OpenAI names them.
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
MAX_REPORTED = 100  # line errors reported; the count says how many more


@frozen
class LineError:
    """One problem of an input file: OpenAI's `{code, message, line, param}`."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "line": self.line, "param": self.param}


@frozen
class RequestLine:
    """One request of an input file."""

    line: int  # 1-based, as an editor numbers it
    custom_id: str
    url: str
    body: dict[str, object]


@frozen
class Checked:
    """An input file read: its request lines, and every problem found (none: it may run)."""

    lines: list[RequestLine]
    errors: list[LineError]

    @property
    def ok(self) -> bool:
        return not self.errors


def check_file(content: bytes, max_requests: int) -> Checked:
    """Read a batch input file, reporting every bad line (up to MAX_REPORTED)."""
    errors: list[LineError] = []
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as e:
        return Checked([], [LineError("invalid_file", f"the file is not UTF-8 text ({e.reason})")])
    if text.startswith("\ufeff"):
        text = text[1:]
    raw = text.split("\n")
    if raw and raw[-1].strip() == "":
        raw.pop()  # the newline that ends the last line
    if not raw:
        return Checked([], [LineError("empty_file", "the file has no request lines")])
    if len(raw) > max_requests:
        message = f"the file has {len(raw)} lines; a batch holds at most {max_requests} requests"
        return Checked([], [LineError("too_many_requests", message)])
    lines: list[RequestLine] = []
    seen: dict[str, int] = {}
    first_url = ""
    for number, source in enumerate(raw, start=1):
        found = _line(number, source)
        if isinstance(found, LineError):
            errors.append(found)
            continue
        if found.custom_id in seen:
            message = f"custom_id {found.custom_id!r} is also on line {seen[found.custom_id]}"
            errors.append(LineError("duplicate_custom_id", message, number, "custom_id"))
            continue
        seen[found.custom_id] = number
        if not first_url:
            first_url = found.url
        elif found.url != first_url:
            message = f"url {found.url!r} differs from the first line's {first_url!r}"
            errors.append(LineError("mismatched_url", message, number, "url"))
            continue
        lines.append(found)
    return Checked(lines, _reported(errors))


def _line(number: int, source: str) -> RequestLine | LineError:
    if not source.strip():
        return LineError("empty_line", "the line is empty", number)
    try:
        value = json.loads(source)
    except ValueError as e:
        return LineError("invalid_json_line", f"not valid JSON: {e}", number)
    except RecursionError:
        return LineError("invalid_json_line", "nested too deeply to be read", number)
    if not isinstance(value, dict):
        return LineError("invalid_request", "a line must be a JSON object", number)
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return LineError("missing_custom_id", "custom_id must be a non-empty string", number,
                         "custom_id")  # fmt: skip
    method = value.get("method")
    if method != "POST":
        return LineError("invalid_method", f"method must be POST, not {method!r}", number, "method")
    url = value.get("url")
    if url not in ENDPOINTS:
        message = f"url must be one of {', '.join(ENDPOINTS)}, not {url!r}"
        return LineError("invalid_url", message, number, "url")
    body = value.get("body")
    if not isinstance(body, dict):
        return LineError("invalid_body", "body must be a JSON object", number, "body")
    if body.get("stream") is True:
        message = "a batch's requests are answered whole: stream must not be true"
        return LineError("invalid_body", message, number, "body.stream")
    assert isinstance(url, str)
    return RequestLine(number, custom_id, url, body)


def check_batch(
    checked: Checked, endpoint: str, model_error: Callable[[object], str | None]
) -> Checked:
    """`checked`'s lines as a batch for `endpoint` runs them: each line's url must be the
    endpoint, and `model_error` (the route and key's rule) must find nothing wrong with its
    body's model."""
    errors = list(checked.errors)
    for line in checked.lines:
        if line.url != endpoint:
            message = f"url {line.url!r} is not the batch's endpoint {endpoint!r}"
            errors.append(LineError("invalid_url", message, line.line, "url"))
            continue
        why = model_error(line.body.get("model"))
        if why is not None:
            errors.append(LineError("model_not_found", why, line.line, "body.model"))
    return Checked(checked.lines, _reported(errors))


def _reported(errors: list[LineError]) -> list[LineError]:
    if len(errors) <= MAX_REPORTED:
        return errors
    more = len(errors) - MAX_REPORTED
    return [*errors[:MAX_REPORTED], LineError("more_errors", f"and {more} more lines like these")]
