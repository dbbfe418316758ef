"""Writing to the client: error and JSON answers, header rewriting, the streamed relay."""

from __future__ import annotations

import json
from typing import Any

from attrs import define
from twisted.web.http_headers import Headers

from crossbar.accounting import Meter
from crossbar.errors import ClientError, error_body
from crossbar.forward import Relay, hop_by_hop

# Never forwarded upstream: recomputed (Host, Content-Length), the client's own credentials
# (the host's api_key replaces them; x-api-key is how Anthropic's SDKs send theirs), and
# Accept-Encoding so the body stays readable for usage.
_DROP_REQUEST = frozenset(
    {b"host", b"content-length", b"authorization", b"x-api-key", b"accept-encoding"}
)


@define
class Exchange:
    """What one request did, collected as it goes, for its usage row and log line."""

    started: float
    route: str = ""
    fp: str = ""
    model: str = ""
    host: str = ""
    path: str = ""
    status: int = 0
    stream: bool = False
    queue_ms: float = 0.0
    ttfb_ms: float | None = None
    lease: str = ""
    error: str = ""
    chars: int = 0  # prompt characters, for the context guard's learned ratio
    meter: Meter | None = None
    remembered: bool = False  # the completion id is in the id memory


def header_reader(request: Any):
    """`name -> str | None` over the request's headers."""

    def header(name: str) -> str | None:
        value = request.getHeader(name)
        return value.decode("latin-1") if isinstance(value, bytes) else value

    return header


def upstream_headers(request: Any, api_key: str) -> Headers:
    """The client's headers minus hop-by-hop ones and its credentials, plus X-Forwarded-*."""
    incoming = request.requestHeaders
    drop = hop_by_hop(incoming) | _DROP_REQUEST
    out = Headers()
    for name, values in incoming.getAllRawHeaders():
        if name.lower() not in drop:
            out.setRawHeaders(name, values)
    peer = getattr(request.getClientAddress(), "host", "")
    prior = b", ".join(incoming.getRawHeaders(b"x-forwarded-for", []))
    out.setRawHeaders(b"x-forwarded-for", [(prior + b", " if prior else b"") + peer.encode()])
    out.setRawHeaders(b"x-forwarded-proto", [b"https" if request.isSecure() else b"http"])
    host = incoming.getRawHeaders(b"host")
    if host:
        out.setRawHeaders(b"x-forwarded-host", [host[0]])
    if api_key:
        out.setRawHeaders(b"authorization", [b"Bearer " + api_key.encode()])
    return out


def answer_json(request: Any, status: int, obj: Any, ex: Exchange | None = None) -> None:
    if ex is not None:
        ex.status = status
    request.setResponseCode(status)
    request.responseHeaders.setRawHeaders(b"content-type", [b"application/json"])
    request.write(json.dumps(obj).encode())
    request.finish()


def answer_error(request: Any, error: ClientError) -> None:
    """The OpenAI error body, unless the client is gone or the response already started."""
    if request.finished or request._disconnected:
        return
    if request.startedWriting:
        request.channel.transport.loseConnection()
        return
    request.setResponseCode(error.status)
    request.responseHeaders.setRawHeaders(b"content-type", [b"application/json"])
    for name, value in error.headers.items():
        request.responseHeaders.setRawHeaders(name.encode(), [value.encode()])
    request.write(error.body())
    request.finish()


def models_list(models: list[str]) -> dict[str, Any]:
    """The route's models in OpenAI's list format."""
    data = [{"id": m, "object": "model", "created": 0, "owned_by": "crossbar"} for m in models]
    return {"object": "list", "data": data}


async def relay(app: Any, request: Any, ex: Exchange, response: Any) -> None:
    """Relay status, headers and the body as it arrives; make a broken stream detectable."""
    ex.status = response.code
    request.setResponseCode(response.code, response.phrase)
    drop = hop_by_hop(response.headers, getattr(response, "connection_headers", None))
    for name, values in response.headers.getAllRawHeaders():
        if name.lower() not in drop:
            request.responseHeaders.setRawHeaders(name, values)
    ctype = (response.headers.getRawHeaders(b"content-type") or [b""])[0]
    ex.stream = ctype.lower().startswith(b"text/event-stream")
    for name, value in (
        (b"X-Crossbar-Host", ex.host),
        (b"X-Crossbar-Lease", ex.lease),
        (b"X-Crossbar-Queue-Ms", str(round(ex.queue_ms))),
    ):
        request.responseHeaders.setRawHeaders(name, [value.encode()])
    meter = ex.meter = Meter(stream=ex.stream)

    def on_data(data: bytes) -> None:
        if ex.ttfb_ms is None:
            ex.ttfb_ms = (app.clock.seconds() - ex.started) * 1000
        meter.feed(data)
        if meter.ids and not ex.remembered:
            # Remembered while the stream runs: a control call may name it before it ends.
            ex.remembered = True
            app.ids.remember(meter.ids, ex.host, ex.fp, app.clock.seconds())

    body = Relay(request, app.clock, app.config.server.upstream_idle_timeout, on_data)
    response.deliverBody(body)
    await body.done
    if body.complete():
        meter.finish()
        request.finish()
        return
    meter.delivered()
    ex.error = "upstream idle timeout" if body.timed_out else "upstream closed mid-response"
    if ex.stream:
        # One error event, then close without the terminating chunk: the client can tell the
        # stream was cut. No [DONE] is ever invented.
        event = json.loads(error_body(502, "api_error", f"host {ex.host}: {ex.error}"))
        request.write(b"data: " + json.dumps(event).encode() + b"\n\n")
    request.channel.transport.loseConnection()
