"""The Batch API's objects and lines in OpenAI's shapes: file objects, batch objects, the output
and error files' lines; and the ids crossbar gives them."""

from __future__ import annotations

import json
import secrets
from typing import Any

from crossbar.store import BatchRow, FileRow


def new_id(prefix: str) -> str:
    """A fresh id in OpenAI's style (`file-…`, `batch_…`, `batch_req_…`)."""
    return prefix + secrets.token_hex(12)


def _time(seconds: float) -> int | None:
    return int(seconds) if seconds else None


def file_object(row: FileRow) -> dict[str, Any]:
    """A file as `GET /v1/files/{id}` shows it."""
    return {
        "id": row.id,
        "object": "file",
        "bytes": row.bytes,
        "created_at": int(row.created),
        "filename": row.filename,
        "purpose": row.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


def batch_object(row: BatchRow) -> dict[str, Any]:
    """A batch as `GET /v1/batches/{id}` shows it."""
    counts = row.counts
    errors = json.loads(row.errors) if row.errors else None
    return {
        "id": row.id,
        "object": "batch",
        "endpoint": row.endpoint,
        "errors": None if not errors else {"object": "list", "data": errors},
        "input_file_id": row.input_file_id,
        "completion_window": row.completion_window,
        "status": row.status,
        "output_file_id": row.output_file_id or None,
        "error_file_id": row.error_file_id or None,
        "created_at": int(row.created),
        "in_progress_at": _time(row.in_progress_at),
        "expires_at": _time(row.expires_at),
        "finalizing_at": _time(row.finalizing_at),
        "completed_at": _time(row.completed_at),
        "failed_at": _time(row.failed_at),
        "expired_at": _time(row.expired_at),
        "cancelling_at": _time(row.cancelling_at),
        "cancelled_at": _time(row.cancelled_at),
        "request_counts": {
            "total": row.total,
            "completed": counts.done,
            "failed": counts.failed,
        },
        "usage": {
            "input_tokens": counts.prompt_tokens,
            "input_tokens_details": {"cached_tokens": counts.cached_tokens},
            "output_tokens": counts.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts.prompt_tokens + counts.completion_tokens,
        },
        "metadata": json.loads(row.metadata) if row.metadata else None,
    }


def answered_line(custom_id: str, status: int, request_id: str, body: Any) -> str:
    """An output or error file's line for a request that got an HTTP answer."""
    return json.dumps(
        {
            "id": new_id("batch_req_"),
            "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": body},
            "error": None,
        }
    )


def failed_line(custom_id: str, code: str, message: str) -> str:
    """An error file's line for a request that got no answer it could keep."""
    return json.dumps(
        {
            "id": new_id("batch_req_"),
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        }
    )


_NOT_RUN = {
    "expired": ("batch_expired", "the batch's completion window passed before this request ran"),
    "cancelled": ("batch_cancelled", "the batch was cancelled before this request ran"),
}


def not_run_line(custom_id: str, ending: str) -> str:
    """The error line of a request its batch's end left unrun (`expired`, `cancelled`)."""
    code, message = _NOT_RUN.get(ending, ("batch_ended", f"the batch {ending} first"))
    return failed_line(custom_id, code, message)
