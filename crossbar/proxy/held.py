"""The bound on request bodies both ports share: each body's bytes taken from the sites'
`BodyMemory` as they arrive and kept in one `HeldBody`.

A body takes its bytes from the sites' `BodyMemory` as they arrive, into one buffer (never an
object per read or chunk), and gives them back and drops them when its request ends
(answered, refused, its client gone). A declared length (its Content-Length once the headers
are in, each chunk's size before its data) past `max_body` is 413, and past what the memory
has left 503, both before its bytes are read; bytes that arrive past what is left are 503 as
they do. A body declared and never sent holds nothing (the channel's `body_timeout` closes
it).

Plain Python in every build: the admin port's request (proxy/site.py `BoundedRequest`) mixes
`HoldsBody` into twisted.web's Request, which a class compiled by mypyc cannot be.
"""

from __future__ import annotations

from typing import Any

from attrs import define

from crossbar.config import format_size
from crossbar.wire import ClientError, unavailable

# A body refused for memory asks to come back after this: bodies are given back as their
# requests end, and an answer takes seconds.
_MEMORY_RETRY_AFTER = 5.0


@define
class BodyMemory:
    """Bytes of request bodies held at once, over every connection of the sites sharing it."""

    limit: int
    held: int = 0

    def take(self, n: int) -> bool:
        """Hold `n` more bytes if they fit under the limit; False (nothing taken) if not."""
        if n and self.held + n > self.limit:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n


def too_large(limit: int) -> ClientError:
    return ClientError(
        413,
        "invalid_request_error",
        f"request body is larger than this server's limit of {format_size(limit)}",
    )


def no_memory(limit: int) -> ClientError:
    return unavailable(
        f"this server holds as many request bodies as it may at once ({format_size(limit)}, "
        "server.max_body_memory); try again shortly",
        retry_after=_MEMORY_RETRY_AFTER,
    )


class HeldBody:
    """One request's body as it arrives, within its site's `max_body` and `memory`.

    The bytes are kept in one buffer that grows with them (a read's bytes as they are when the
    body came in one read), never an object per read or per chunk: a body of 1-byte chunks
    costs its bytes, not an object and a list slot for each. Each byte is taken from `memory`
    as it arrives, so a body declared and never sent holds nothing."""

    __slots__ = ("_buffer", "_held", "_memory", "declared")

    def __init__(self) -> None:
        self._buffer: bytes | bytearray = b""
        self.declared = 0  # declared so far: the Content-Length, or the chunk sizes
        self._held = 0  # taken from `_memory`, given back by `release`
        self._memory: BodyMemory | None = None

    def declare(
        self, length: int, max_body: int, memory: BodyMemory
    ) -> tuple[ClientError, str] | None:
        """`length` more bytes are declared: the error and why when they cannot be taken (over
        `max_body`, or more than `memory` has left now). Nothing is taken until they arrive."""
        if self.declared + length > max_body:
            return too_large(max_body), "request body too large"
        if length > memory.limit - memory.held:
            return no_memory(memory.limit), "request bodies over max_body_memory"
        self.declared += length
        return None

    def add(self, data: bytes, memory: BodyMemory) -> tuple[ClientError, str] | None:
        """Keep `data`, taking its bytes from `memory`; the error and why when they do not fit
        (nothing kept)."""
        if not memory.take(len(data)):
            return no_memory(memory.limit), "request bodies over max_body_memory"
        self._memory = memory
        self._held += len(data)
        buffer = self._buffer
        if not buffer:
            self._buffer = data  # the whole body in one read: kept as it came, no copy
        elif isinstance(buffer, bytearray):
            buffer += data
        else:
            grown = bytearray(buffer)
            grown += data
            self._buffer = grown
        return None

    def content(self) -> bytes:
        """The body so far, in one piece: a grown buffer becomes bytes once, and the buffer
        goes (the body is never held twice for longer than the copy)."""
        buffer = self._buffer
        if isinstance(buffer, bytearray):
            buffer = self._buffer = bytes(buffer)
        return buffer

    def release(self) -> None:
        """Give the bytes back to `memory` and drop them: the request has ended."""
        self._buffer = b""
        if self._memory is not None and self._held:
            self._memory.give(self._held)
            self._held = 0


class HoldsBody:
    """What the channel calls as a body arrives, for both ports' requests: each declared
    length checked against `max_body` and the sites' `BodyMemory`, each byte taken from that
    memory as it arrives and kept in a `HeldBody`, and a body over a bound refused at once on
    the raw connection."""

    _body: HeldBody
    _refused = False
    channel: Any

    def chunk_declared(self, length: int) -> bool:
        """The next chunk of the body has `length` bytes; False when that refused the body."""
        return self._declare(length)

    def _declare(self, length: int) -> bool:
        site = self.channel.site
        refused = self._body.declare(length, site.max_body, site.memory)
        if refused is not None:
            self._refuse(*refused)
            return False
        return True

    def handleContentChunk(self, data: bytes) -> None:
        if not self._refused:
            refused = self._body.add(data, self.channel.site.memory)
            if refused is not None:
                self._refuse(*refused)

    def _refuse(self, error: ClientError, why: str) -> None:
        """Answer `error` at once on the raw connection and close it: the rest of the body is
        never read, and what it held is given back."""
        self._refused = True
        self._body.release()
        self.channel.refuse(error, why, self)
