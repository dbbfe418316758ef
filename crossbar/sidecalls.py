"""Calls that must reach one particular host: by completion id, and exact token counts."""

from __future__ import annotations

import json
from typing import Any

import treq
from twisted.internet.defer import CancelledError
from twisted.web.http_headers import Headers

from crossbar.ids import Origin

CONTROL = "/v1/chat/completions/control"
RESPONSES = "/v1/responses"


def named_origin(app: Any, path: str, body: Any, now: float) -> Origin | None:
    """The remembered completion a request names: a control call's `id`, or a Responses call's
    `previous_response_id`."""
    if not isinstance(body, dict):
        return None
    if path == CONTROL:
        name = body.get("id")
    elif path.startswith(RESPONSES):
        name = body.get("previous_response_id")
    else:
        return None
    return app.ids.lookup(name, now) if isinstance(name, str) and name else None


def _count_request(path: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    if path == "/v1/messages":  # Anthropic: its top-level `system` counts too
        return "/v1/messages/count_tokens", body
    if isinstance(body.get("messages"), list):
        return "/v1/chat/completions/input_tokens", body
    if path.startswith(RESPONSES):
        return "/v1/responses/input_tokens", body
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return "/tokenize", {"content": prompt}
    return None


async def exact_count(app: Any, host: str, path: str, body: Any) -> int | None:
    """Ask `host` how many tokens the prompt is; None when it cannot say."""
    if not isinstance(body, dict):
        return None
    found = _count_request(path, body)
    if found is None:
        return None
    count_path, payload = found
    config = app.config.hosts.get(host)
    if config is None:  # a reload removed the host meanwhile
        return None
    headers = Headers({b"content-type": [b"application/json"]})
    if config.api_key:
        headers.setRawHeaders(b"authorization", [b"Bearer " + config.api_key.encode()])
    try:
        response = await app.upstream.send(
            b"POST", (config.url + count_path).encode(), headers, json.dumps(payload).encode()
        )
        data = json.loads(await treq.content(response))
    except CancelledError:
        raise  # the client left: stop here, never go on to send the request
    except Exception:
        return None  # the host will refuse an oversized prompt itself
    if response.code != 200 or not isinstance(data, dict):
        return None
    if isinstance(data.get("input_tokens"), int):
        return data["input_tokens"]
    tokens = data.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None
