"""A request crossbar refuses before it knows the route is still logged and counted: one
`crossbar.request` line and a `crossbar_requests_total` sample, under the route its path names
when the config has it, else `(unknown)`; such requests are never stored as usage."""

import pytest_twisted
from twisted.internet import protocol, reactor
from twisted.internet.defer import Deferred
from twisted.logger import formatEvent, globalLogPublisher

from tests.admin.test_metrics import scrape, total
from tests.support.admin_harness import start_service, write_config
from tests.support.harness import MODEL, start_fakes, wait

ROUTES = {"convo": {"hosts": ["titan"], "default_model": MODEL}}


class _Raw(protocol.Protocol):
    """Sends bytes as they are and keeps everything the server answers until it closes."""

    def __init__(self, data: bytes) -> None:
        self.data, self.answer, self.done = data, b"", Deferred()

    def connectionMade(self) -> None:
        self.transport.write(self.data)

    def dataReceived(self, data: bytes) -> None:
        self.answer += data

    def connectionLost(self, reason: object) -> None:
        self.done.callback(self.answer)


async def send_raw(port: int, data: bytes) -> bytes:
    raw = _Raw(data)
    await wait(protocol.ClientCreator(reactor, lambda: raw).connectTCP("127.0.0.1", port))
    return await wait(raw.done)


def request(path: str, body: bytes = b"{}", length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {size}\r\nConnection: close\r\n\r\n"
    ).encode() + body


@pytest_twisted.ensureDeferred
async def test_refusals_before_routing_are_logged_and_counted_but_not_stored(tmp_path):
    fakes = await start_fakes("titan")
    path = write_config(tmp_path / "c.toml", fakes, ROUTES, server={"max_body": "1KiB"})
    running = await start_service(path, fakes)
    lines: list[str] = []

    def hear(event: dict) -> None:
        if event.get("log_namespace") == "crossbar.request":
            lines.append(formatEvent(event))

    globalLogPublisher.addObserver(hear)
    try:
        port = running.service.proxy_port.getHost().port
        unknown = await send_raw(port, request("/r/nope/v1/chat/completions"))
        assert unknown.startswith(b"HTTP/1.1 404 ")
        too_big = await send_raw(port, request("/r/convo/v1/chat/completions", length=5000))
        assert too_big.startswith(b"HTTP/1.1 413 ")
        too_big_nowhere = await send_raw(port, request("/r/nope/v1/chat/completions", length=9000))
        assert too_big_nowhere.startswith(b"HTTP/1.1 413 ")
        garbage = await send_raw(port, b"NOT HTTP AT ALL\r\n\r\n")
        assert garbage.startswith(b"HTTP/1.1 400 ")

        samples = await scrape(running)
        assert total(samples, "crossbar_requests_total", route="(unknown)", status="404") == 1
        assert total(samples, "crossbar_requests_total", route="convo", status="413") == 1
        assert total(samples, "crossbar_requests_total", route="(unknown)", status="413") == 1
        assert total(samples, "crossbar_requests_total", route="(unknown)", status="400") == 1
        assert total(samples, "crossbar_request_errors_total") == 4

        assert len(lines) == 4
        assert lines[0].startswith("(unknown) /v1/chat/completions -> - - 404 ")
        assert "unknown route 'nope'" in lines[0]
        assert lines[1].startswith("convo /v1/chat/completions -> - - 413 ")
        assert "error='request body too large'" in lines[1]

        usage = await running.get("/api/usage?by=route")
        assert usage["usage"] == []  # counted and logged, never stored
    finally:
        globalLogPublisher.removeObserver(hear)
        await running.stop()
