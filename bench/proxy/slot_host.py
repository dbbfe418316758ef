"""A one-slot stand-in for llama-server that notes, to the nanosecond, when each request came and
each answer ended: the host of bench/proxy/slot_handoff.py.

    .venv/bin/python bench/proxy/slot_host.py --port 24001 [--gen-ms 10] [--tokens 8]

Prints `slot_host listening on PORT` once it accepts connections, then serves HTTP/1.1 with
keep-alive on 127.0.0.1 from one thread (a `selectors` loop; no Twisted, no parser library, so
that its own share of a hand-off stays small and the same whoever is in front of it):

- `GET /health` -> 200 `{"status": "ok"}`; `GET /props` -> `{"total_slots": 1,
  "default_generation_settings": {"n_ctx": 4096}}`; `GET /v1/models` and `GET /models` -> its
  one model, `tiny`.
- `POST /v1/chat/completions`: one at a time, like a llama-server with one slot; a request that
  comes while the slot is busy waits in the host's own queue, in arrival order, and is taken
  the moment the answer before it has been written. Each answer takes `--gen-ms` of
  "generation", then comes as one JSON body carrying `usage` and `timings`, or, when the body
  says `"stream": true`, as an SSE stream: the role's event at once, `--tokens` token events
  spread over the generation time, the last with `finish_reason`, `usage` and `timings`,
  then `data: [DONE]`.
- `GET /_bench/records` -> `{"records": [...], "accepted": N}`: one record per answered chat
  completion since the last such call (which it then forgets), in the order the slot took
  them: the request's `X-Bench-Id` header, the number of the connection it came on, and three
  `time.monotonic_ns()` readings (CLOCK_MONOTONIC, the same clock in every process of the
  machine): `arrived` (its first byte was read: after recv() returned), `taken` (the slot
  took it) and `ended` (just before the send() that handed the last byte of its answer to the
  kernel: read before, as a reader on the other core may have the byte before send()
  returns); `accepted` counts the connections accepted since the host started.

Anything else is a 404. A request body must come with a Content-Length (no chunked bodies).
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

MODEL = "tiny"
N_CTX = 4096
MAX_HEAD = 64 * 1024
PROMPT_TOKENS = 12  # what the answers say the prompt was: the clients' prompts are that short

Clock = Callable[[], int]


class BadRequest(Exception):
    """Bytes this host does not read as an HTTP/1.1 request; the connection is closed."""


@dataclass(slots=True)
class Incoming:
    """One request, whole: `arrived` is when its first byte was read (monotonic ns)."""

    method: str
    path: str
    headers: dict[str, str]  # names in lower case; a repeated one keeps its last value
    body: bytes
    arrived: int
    keep_alive: bool


class RequestReader:
    """Cuts one connection's bytes into requests, noting when each one's first byte came."""

    def __init__(self) -> None:
        self._buffer = b""
        self._arrived: int | None = None

    def feed(self, data: bytes, now: int) -> list[Incoming]:
        """The requests `data` completes (read at `now`); BadRequest for what is not one."""
        if data and self._arrived is None:
            self._arrived = now
        self._buffer += data
        done: list[Incoming] = []
        while self._buffer:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD:
                    raise BadRequest("request head over 64 KiB")
                break
            lines = self._buffer[:end].decode("latin-1").split("\r\n")
            try:
                method, target, version = lines[0].split(" ")
            except ValueError:
                raise BadRequest(f"bad request line {lines[0]!r}") from None
            headers = {}
            for line in lines[1:]:
                name, colon, value = line.partition(":")
                if not colon:
                    raise BadRequest(f"bad header line {line!r}")
                headers[name.strip().lower()] = value.strip()
            if "transfer-encoding" in headers:
                raise BadRequest("only bodies with a Content-Length are read")
            length = int(headers.get("content-length", "0") or "0")
            total = end + 4 + length
            if len(self._buffer) < total:
                break
            body, self._buffer = self._buffer[end + 4 : total], self._buffer[total:]
            tokens = headers.get("connection", "").lower()
            keep = "close" not in tokens if version == "HTTP/1.1" else "keep-alive" in tokens
            assert self._arrived is not None
            done.append(Incoming(method, target, headers, body, self._arrived, keep))
            self._arrived = now if self._buffer else None  # a pipelined request came with it
        return done


@dataclass(slots=True)
class Record:
    """One answered chat completion: its X-Bench-Id, its connection's number, and when it
    arrived, was taken by the slot and its answer ended (monotonic ns)."""

    id: str
    connection: int
    arrived: int
    taken: int
    ended: int


@dataclass(slots=True)
class Job:
    """A chat completion, waiting for the slot or in it."""

    id: str
    connection: int
    arrived: int
    stream: bool
    keep_alive: bool
    taken: int = 0
    sent: int = 0  # token events written so far (a stream)
    due: int = 0  # when its next write is due


@dataclass
class Slot:
    """The host's one slot and its queue, in arrival order, and the records of the answers
    it ended."""

    queue: deque[Job] = field(default_factory=deque)
    current: Job | None = None
    records: list[Record] = field(default_factory=list)

    def offer(self, job: Job) -> None:
        """`job` joins the back of the queue."""
        self.queue.append(job)

    def take(self, now: int) -> Job | None:
        """The next job, taken into the free slot at `now`; None when busy or none waits."""
        if self.current is not None or not self.queue:
            return None
        job = self.current = self.queue.popleft()
        job.taken = now
        return job

    def end(self, now: int) -> Record:
        """The current job's answer ended at `now`: its record, and the slot is free."""
        job = self.current
        assert job is not None
        self.current = None
        record = Record(job.id, job.connection, job.arrived, job.taken, now)
        self.records.append(record)
        return record

    def drop(self, connection: int) -> None:
        """`connection` closed: its jobs go, unrecorded (a slot it held frees)."""
        self.queue = deque(j for j in self.queue if j.connection != connection)
        if self.current is not None and self.current.connection == connection:
            self.current = None

    def take_records(self) -> list[Record]:
        """The records so far, forgotten here."""
        records, self.records = self.records, []
        return records


# --- what the host says ---------------------------------------------------------------------

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found"}


def response(status: int, body: bytes, keep_alive: bool, ctype: str = "application/json") -> bytes:
    """A whole answer with a Content-Length."""
    close = "" if keep_alive else "Connection: close\r\n"
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: {ctype}\r\n"
        f"Content-Length: {len(body)}\r\n{close}\r\n"
    )
    return head.encode() + body


def _usage(tokens: int, gen_ms: float) -> dict[str, object]:
    """An answer's `usage` and `timings`, llama-server's way."""
    return {
        "usage": {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": tokens,
            "total_tokens": PROMPT_TOKENS + tokens,
        },
        "timings": {
            "cache_n": 0,
            "prompt_n": PROMPT_TOKENS,
            "prompt_ms": 0.1,
            "predicted_n": tokens,
            "predicted_ms": gen_ms,
        },
    }


def chat_answer(number: int, tokens: int, gen_ms: float, keep_alive: bool) -> bytes:
    """A whole chat completion of `tokens` tokens, with usage and timings."""
    body = {
        "id": f"chatcmpl-{number}",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok " * tokens},
                "finish_reason": "stop",
            }
        ],
        **_usage(tokens, gen_ms),
    }
    return response(200, json.dumps(body).encode(), keep_alive)


def _chunk(data: bytes) -> bytes:
    """`data` as one chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(number: int, delta: dict[str, str], extra: dict[str, object] | None = None) -> bytes:
    """One SSE event of answer `number` as a chunk; `extra` (usage, timings) makes it the
    last, with `finish_reason`."""
    choice: dict[str, object] = {"index": 0, "delta": delta, "finish_reason": None}
    payload: dict[str, object] = {
        "id": f"chatcmpl-{number}",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "choices": [choice],
    }
    if extra is not None:
        choice["finish_reason"] = "stop"
        payload.update(extra)
    return _chunk(b"data: " + json.dumps(payload).encode() + b"\n\n")


def stream_head(number: int, keep_alive: bool) -> bytes:
    """An SSE answer's head and its first event (the assistant's role)."""
    close = "" if keep_alive else "Connection: close\r\n"
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        f"Transfer-Encoding: chunked\r\n{close}\r\n"
    )
    return head.encode() + _event(number, {"role": "assistant", "content": ""})


def stream_token(number: int) -> bytes:
    """One token's event."""
    return _event(number, {"content": "ok "})


def stream_tail(number: int, tokens: int, gen_ms: float) -> bytes:
    """The last token's event with finish_reason, usage and timings, `[DONE]`, and the end."""
    last = _event(number, {"content": "ok "}, _usage(tokens, gen_ms))
    return last + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


# --- the loop ---------------------------------------------------------------------------------


class Connection:
    """One accepted connection: its reader, and what is still to be written to it."""

    def __init__(self, number: int, sock: socket.socket) -> None:
        self.number = number
        self.sock = sock
        self.reader = RequestReader()
        self.pending = b""
        self.close_after = False
        self.flushed: Callable[[int], None] | None = None  # called once `pending` is all written


class TinyHost:
    """The host: a listening socket, its connections, the slot; driven by `step`."""

    def __init__(
        self, listener: socket.socket, gen_ms: float, tokens: int, clock: Clock = time.monotonic_ns
    ) -> None:
        listener.setblocking(False)
        self.listener = listener
        self.gen_ms = gen_ms
        self.tokens = max(1, tokens)
        self.clock = clock
        self.slot = Slot()
        self.accepted = 0
        self.answers = 0
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._connections: dict[int, Connection] = {}

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self.listener.getsockname()[1])

    def close(self) -> None:
        """Close every connection and the listening socket."""
        for connection in list(self._connections.values()):
            self._close(connection)
        self._selector.close()
        self.listener.close()

    def serve_forever(self) -> None:
        """Step until the process is stopped."""
        while True:
            self.step(None)

    def step(self, timeout: float | None) -> None:
        """Wait for the sockets (at most `timeout` seconds, or until the slot's next write is
        due), handle what is ready, then do the slot's writes that are due."""
        job = self.slot.current
        if job is not None:
            left = max(0.0, (job.due - self.clock()) / 1e9)
            timeout = left if timeout is None else min(timeout, left)
        for key, mask in self._selector.select(timeout):
            connection = key.data
            if connection is None:
                self._accept()
                continue
            if mask & selectors.EVENT_WRITE:
                self._flush(connection)
            if mask & selectors.EVENT_READ and connection.number in self._connections:
                self._read(connection)
        self._run_slot()

    # -- sockets

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.accepted += 1
            connection = Connection(self.accepted, sock)
            self._connections[connection.number] = connection
            self._selector.register(sock, selectors.EVENT_READ, connection)

    def _read(self, connection: Connection) -> None:
        try:
            data = connection.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(connection)
            return
        try:
            requests = connection.reader.feed(data, self.clock())
        except BadRequest as e:
            connection.close_after = True
            self._write(connection, response(400, str(e).encode(), False, "text/plain"))
            return
        for request in requests:
            self._handle(connection, request)

    def _write(
        self, connection: Connection, data: bytes, flushed: Callable[[int], None] | None = None
    ) -> None:
        """Write `data` after what is pending; `flushed` is called, once it all went, with the
        time read just before the send() that handed its last byte to the kernel (a reader on
        another core may have it before that send() returns)."""
        before = 0
        if connection.pending:
            connection.pending += data
        else:
            before = self.clock()
            try:
                sent = connection.sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._close(connection)
                return
            connection.pending = data[sent:]
            if connection.pending:
                self._selector.modify(
                    connection.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, connection
                )
        if flushed is not None:
            if connection.pending:
                connection.flushed = flushed
            else:
                flushed(before)
        if not connection.pending and connection.close_after:
            self._close(connection)

    def _flush(self, connection: Connection) -> None:
        before = self.clock()
        try:
            sent = connection.sock.send(connection.pending)
        except BlockingIOError:
            return
        except OSError:
            self._close(connection)
            return
        connection.pending = connection.pending[sent:]
        if connection.pending:
            return
        self._selector.modify(connection.sock, selectors.EVENT_READ, connection)
        flushed, connection.flushed = connection.flushed, None
        if flushed is not None:
            flushed(before)
        if connection.close_after:
            self._close(connection)

    def _close(self, connection: Connection) -> None:
        if self._connections.pop(connection.number, None) is None:
            return
        self._selector.unregister(connection.sock)
        connection.sock.close()
        self.slot.drop(connection.number)

    # -- requests

    def _handle(self, connection: Connection, request: Incoming) -> None:
        if not request.keep_alive:
            connection.close_after = True
        path = request.path.split("?", 1)[0]
        if request.method == "POST" and path == "/v1/chat/completions":
            try:
                body = json.loads(request.body)
            except ValueError:
                body = None
            stream = isinstance(body, dict) and body.get("stream") is True
            job_id = request.headers.get("x-bench-id", "")
            job = Job(job_id, connection.number, request.arrived, stream, request.keep_alive)
            self.slot.offer(job)
            self._run_slot()
            return
        keep = request.keep_alive
        if request.method != "GET":
            self._write(connection, response(404, b'{"error": "not found"}', keep))
        elif path == "/health":
            self._write(connection, response(200, b'{"status": "ok"}', keep))
        elif path == "/props":
            props = {"total_slots": 1, "default_generation_settings": {"n_ctx": N_CTX}}
            self._write(connection, response(200, json.dumps(props).encode(), keep))
        elif path in ("/v1/models", "/models"):
            models = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
            self._write(connection, response(200, json.dumps(models).encode(), keep))
        elif path == "/_bench/records":
            records = [asdict(r) for r in self.slot.take_records()]
            state = {"records": records, "accepted": self.accepted}
            self._write(connection, response(200, json.dumps(state).encode(), keep))
        else:
            self._write(connection, response(404, b'{"error": "not found"}', keep))

    # -- the slot

    def _run_slot(self) -> None:
        """Do what is due: the current job's writes, and taking the next job once it ends."""
        while True:
            job = self.slot.current
            if job is None:
                job = self.slot.take(self.clock())
                if job is None:
                    return
                self._begin(job)
                continue
            if self.clock() < job.due:
                return
            if not self._advance(job):
                return

    def _begin(self, job: Job) -> None:
        self.answers += 1
        gen_ns = int(self.gen_ms * 1e6)
        if job.stream:
            job.due = job.taken + gen_ns // self.tokens
            self._send(job, stream_head(self.answers, job.keep_alive), last=False)
        else:
            job.due = job.taken + gen_ns

    def _advance(self, job: Job) -> bool:
        """The job's due write; True when the slot may go on at once (the job ended)."""
        if not job.stream:
            answer = chat_answer(self.answers, self.tokens, self.gen_ms, job.keep_alive)
            return self._send(job, answer, last=True)
        job.sent += 1
        if job.sent < self.tokens:
            job.due = job.taken + int(self.gen_ms * 1e6) * (job.sent + 1) // self.tokens
            return self._send(job, stream_token(self.answers), last=False)
        return self._send(job, stream_tail(self.answers, self.tokens, self.gen_ms), last=True)

    def _send(self, job: Job, data: bytes, last: bool) -> bool:
        """Write part of `job`'s answer; its last part ends it when the kernel has it all.
        True when the slot is free again."""
        connection = self._connections.get(job.connection)
        if connection is None:  # it closed: the slot was freed with it
            return True
        slot = self.slot

        def ended(at: int) -> None:
            if slot.current is job:
                slot.end(at)

        self._write(connection, data, ended if last else None)
        return slot.current is not job


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's docstring): serve until stopped."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--gen-ms", type=float, default=10.0, help="each answer's generation time")
    p.add_argument("--tokens", type=int, default=8, help="tokens (SSE events) per answer")
    args = p.parse_args(argv)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.port))
    listener.listen(128)
    host = TinyHost(listener, args.gen_ms, args.tokens)
    print(f"slot_host listening on {host.port}", flush=True)
    try:
        host.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        host.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
