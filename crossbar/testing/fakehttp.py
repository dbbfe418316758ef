"""HTTP plumbing of the fake llama-server: llama-server-shaped errors, JSON and SSE writing."""

from __future__ import annotations

import json
from typing import Any

from twisted.web.server import Request


class ApiError(Exception):
    """An error answer in llama-server's body format:
    `{"error": {"code": status, "message": ..., "type": ...}}` plus any `extra` keys."""

    def __init__(self, status: int, message: str, type_: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {
            "error": {"code": self.status, "message": self.message, "type": self.type, **self.extra}
        }


def bad_request(message: str) -> ApiError:
    return ApiError(400, message, "invalid_request_error")


def not_found() -> ApiError:
    return ApiError(404, "File Not Found", "not_found_error")


def loading_error() -> ApiError:
    return ApiError(503, "Loading model", "unavailable_error")


def server_error(message: str = "fake llama-server: error_500 fault is on") -> ApiError:
    return ApiError(500, message, "server_error")


def busy_error(status: int) -> ApiError:
    """What a server whose own queue is full answers (429 or 503)."""
    return ApiError(status, "fake llama-server: busy fault is on", "unavailable_error")


def send_json(request: Request, body: Any, status: int = 200) -> None:
    """Answer with `body` as JSON and finish the request."""
    data = json.dumps(body).encode()
    request.setResponseCode(status)
    request.setHeader(b"content-type", b"application/json; charset=utf-8")
    request.setHeader(b"content-length", str(len(data)).encode())
    request.write(data)
    request.finish()


def send_text(request: Request, text: str, content_type: bytes) -> None:
    data = text.encode()
    request.setHeader(b"content-type", content_type)
    request.setHeader(b"content-length", str(len(data)).encode())
    request.write(data)
    request.finish()


def read_json_object(request: Request) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying what is wrong with it."""
    raw = request.content.read() if request.content is not None else b""
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"Failed to parse the request body as JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def sse_event(data: Any, event: str | None = None) -> bytes:
    """One server-sent event: `data: <json>` (or the raw string, e.g. `[DONE]`)."""
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()
