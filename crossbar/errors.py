"""Errors crossbar itself answers with, in OpenAI's error body shape (SPEC §4)."""

from __future__ import annotations

import json
from typing import Any

from attrs import field, frozen


@frozen
class ClientError(Exception):
    """An error for the client: HTTP status, OpenAI `type`, optional named `code`, a message."""

    status: int
    type: str
    message: str
    code: str | None = None
    headers: dict[str, str] = field(factory=dict)

    def body(self) -> bytes:
        return error_body(self.status, self.type, self.message, self.code)

    def __str__(self) -> str:
        return f"{self.status} {self.type}: {self.message}"


def error_body(status: int, type_: str, message: str, code: str | None = None) -> bytes:
    """`{"error": {"code", "type", "message"}}`; `code` is the status unless OpenAI names one."""
    error: dict[str, Any] = {"code": code or status, "type": type_, "message": message}
    return json.dumps({"error": error}).encode()


def not_found(message: str, code: str | None = None) -> ClientError:
    return ClientError(404, "not_found_error", message, code)


def bad_request(message: str, code: str | None = None) -> ClientError:
    return ClientError(400, "invalid_request_error", message, code)


def unavailable(message: str, retry_after: float | None = None, status: int = 503) -> ClientError:
    headers = {"Retry-After": str(max(1, round(retry_after)))} if retry_after is not None else {}
    return ClientError(status, "unavailable_error", message, None, headers)
