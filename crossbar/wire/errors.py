"""Every error crossbar answers a client with: the value, its constructors and the one writer,
in the caller's own dialect (docs/reference.md, "Errors"). The domain's errors are mapped to
these where the domain meets HTTP (proxy/refusals.py).

OpenAI's shape is `{"error": {"code", "type", "message"}}`, where `code` is the HTTP status
unless OpenAI names the case; on `/v1/messages*` Anthropic's SDKs expect
`{"type": "error", "error": {"type", "message"}}` with Anthropic's own types.
"""

from __future__ import annotations

import json
from typing import Any

from attrs import field, frozen
from twisted.web import http

from crossbar.wire.dialects import Dialect, ErrorShape

# Reason phrases Twisted lacks ("429 Unknown Status" reads like a bug to whoever sees it), or
# words for them clients know better.
_PHRASES = {
    413: b"Payload Too Large",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
}

# OpenAI's types (and crossbar's own) as Anthropic's SDKs name them.
_ANTHROPIC_TYPES = {
    "invalid_request_error": "invalid_request_error",
    "authentication_error": "authentication_error",
    "permission_error": "permission_error",
    "not_found_error": "not_found_error",
    "rate_limit_error": "rate_limit_error",
    "unavailable_error": "overloaded_error",
    "api_error": "api_error",
}


@frozen
class ClientError(Exception):
    """An error for the client: HTTP status, OpenAI `type`, optional named `code`, a message."""

    status: int
    type: str
    message: str
    code: str | None = None
    headers: dict[str, str] = field(factory=dict)

    def body(self, shape: ErrorShape = ErrorShape.OPENAI) -> bytes:
        """The JSON error body in `shape`."""
        return json.dumps(self.payload(shape)).encode()

    def payload(self, shape: ErrorShape = ErrorShape.OPENAI) -> dict[str, Any]:
        if shape is ErrorShape.ANTHROPIC:
            if self.status == 413:
                kind = "request_too_large"
            elif self.status in (500, 502, 504):
                kind = "api_error"  # Anthropic's overloaded_error means "try later": 503 only
            else:
                kind = _ANTHROPIC_TYPES.get(self.type, "api_error")
            return {"type": "error", "error": {"type": kind, "message": self.message}}
        error = {"code": self.code or self.status, "type": self.type, "message": self.message}
        return {"error": error}

    def stream_event(self, shape: ErrorShape) -> bytes:
        """The error as one SSE event, for a stream that cannot go on."""
        data = json.dumps(self.payload(shape)).encode()
        if shape is ErrorShape.ANTHROPIC:
            return b"event: error\ndata: " + data + b"\n\n"
        return b"data: " + data + b"\n\n"

    def __str__(self) -> str:
        return f"{self.status} {self.type}: {self.message}"


def not_found(message: str, code: str | None = None) -> ClientError:
    return ClientError(404, "not_found_error", message, code)


def bad_request(message: str, code: str | None = None) -> ClientError:
    return ClientError(400, "invalid_request_error", message, code)


def unavailable(message: str, retry_after: float | None = None, status: int = 503) -> ClientError:
    """503 (or `status`) `unavailable_error`, with `Retry-After` in whole seconds (at least 1)."""
    headers = {"Retry-After": str(max(1, round(retry_after)))} if retry_after is not None else {}
    return ClientError(status, "unavailable_error", message, None, headers)


def unauthorized(message: str) -> ClientError:
    """401, asking for a bearer token."""
    return ClientError(401, "authentication_error", message, headers={"WWW-Authenticate": "Bearer"})


def forbidden(message: str) -> ClientError:
    """403: this caller may not do this whatever it sends."""
    return ClientError(403, "permission_error", message)


INTERNAL = ClientError(500, "api_error", "crossbar failed on this request; try again")


def phrase(status: int) -> bytes:
    """The reason phrase of an HTTP status."""
    return _PHRASES.get(status) or http.RESPONSES.get(status) or b"Error"


def write_error(request: Any, error: ClientError, dialect: Dialect | None = None) -> None:
    """Answer `error` in the dialect's shape; when the answer has already begun, close the
    connection instead (a half-sent answer must not look complete); nothing once the client
    is gone."""
    if request.finished or request.channel is None:
        return
    if request.startedWriting:
        request.channel.transport.loseConnection()
        return
    shape = dialect.errors if dialect is not None else ErrorShape.OPENAI
    request.setResponseCode(error.status, phrase(error.status))
    request.responseHeaders.setRawHeaders(b"content-type", [b"application/json"])
    for name, value in error.headers.items():
        request.responseHeaders.setRawHeaders(name.encode(), [value.encode()])
    body = error.body(shape)
    request.responseHeaders.setRawHeaders(b"content-length", [str(len(body)).encode()])
    request.write(body)
    request.finish()
