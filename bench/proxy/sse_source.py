"""A cheap SSE source for bench/proxy/streams.py: pre-built chat-completion chunks on a timer.

    python bench/proxy/sse_source.py PORT [--rate 20] [--tokens 300]

Every POST is answered with a stream of `--tokens` chunks, one every 1/`--rate` seconds on an
absolute schedule (no drift), the first naming the completion id, the last carrying usage,
then `data: [DONE]`. The chunks are built once at start; each tick is one write of ready bytes,
so the source costs little next to a proxy that parses HTTP. Plain asyncio with no HTTP
library: it only has to be cheaper than what it feeds.

It answers as much of llama-server's API as the peer routers of bench/peers/peers.py ask before they
accept a worker or route a request: GET /v1/models (and /models) lists the model, POST
/tokenize answers a few tokens, POST /v1/chat/completions/render is 404 (llama-server has no
such path; vllm-router then tokenizes), any other POST streams and any other GET answers ok.
"""

from __future__ import annotations

import argparse
import asyncio
import json

MODEL = "bench-model"
OK = b'{"status": "ok"}'
MODELS = json.dumps(
    {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "llamacpp"}]}
).encode()
TOKENS = b'{"tokens": [1, 2, 3, 4, 5, 6, 7, 8]}'
NOT_FOUND = b'{"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}'


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def build(tokens: int) -> tuple[bytes, bytes, bytes, bytes]:
    """(response head, first chunk, middle chunk, last chunks) in HTTP chunked framing."""
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1,
            "model": MODEL}  # fmt: skip

    def event(delta: dict, **extra: object) -> bytes:
        obj = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}], **extra}
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    first = _chunk(event({"role": "assistant", "content": "tok"}))
    middle = _chunk(event({"content": " tok"}))
    usage = {"prompt_tokens": 12, "completion_tokens": tokens, "total_tokens": 12 + tokens}
    last = _chunk(event({}, usage=usage)) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    return head, first, middle, last


class Source(asyncio.Protocol):
    """One connection: requests read whole, each answered by one timed stream."""

    def __init__(self, parts: tuple[bytes, bytes, bytes, bytes], tokens: int, gap: float):
        self._head, self._first, self._middle, self._last = parts
        self._tokens, self._gap = tokens, gap
        self._buffer = b""
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while b"\r\n\r\n" in self._buffer:
            head, _, rest = self._buffer.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                return
            self._buffer = rest[length:]
            method, _, rest_of_line = head.partition(b" ")
            path = rest_of_line.partition(b" ")[0]
            if method == b"GET":
                self._answer(200, MODELS if path in (b"/v1/models", b"/models") else OK)
            elif path == b"/tokenize":
                self._answer(200, TOKENS)
            elif path.endswith(b"/render"):
                self._answer(404, NOT_FOUND)
            else:
                self._start()

    def _answer(self, status: int, body: bytes) -> None:
        reason = b"OK" if status == 200 else b"Not Found"
        head = b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n" % (status, reason)
        self.transport.write(head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self.transport.write(self._head + self._first)
        started = loop.time()

        def tick(n: int) -> None:
            if self.transport.is_closing():
                return
            if n >= self._tokens:
                self.transport.write(self._last)
                return
            self.transport.write(self._middle)
            self._timer = loop.call_at(started + (n + 1) * self._gap, tick, n + 1)

        self._timer = loop.call_at(started + self._gap, tick, 2)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()


async def serve(port: int, rate: float, tokens: int) -> None:
    parts = build(tokens)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Source(parts, tokens, 1 / rate), "127.0.0.1", port,
                                      backlog=4096)  # fmt: skip
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--rate", type=float, default=20.0, help="chunks per second per stream")
    parser.add_argument("--tokens", type=int, default=300, help="chunks per stream")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.rate, args.tokens))


if __name__ == "__main__":
    main()
