"""A chunked request body read strictly (RFC 9112, 7.1), in place of Twisted's lenient decoder.

Twisted's decoder waits forever on a chunk size too large to mean anything and on lines that
end in a bare LF, and takes any line after the last chunk for a trailer field, so the head of
a request pipelined behind a last chunk without its final CRLF vanished into the body before
it. Here each of those refuses the request (400) the moment it shows:

- a chunk size that is not hex, or that overflows 63 bits (nginx's bound);
- a line (chunk size or trailer field) that ends in a bare LF, or is longer than 4 KiB;
- chunk data not followed by CRLF;
- a trailer line that is not a header field (`name: value`), or trailers over 16 KiB.

Each declared chunk size is told (`declared`) before its data is read, so a chunk that cannot
be taken (413, 503) is refused before its bytes arrive. Trailer fields are dropped, as Twisted
drops them.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_MAX_CHUNK = 2**63 - 1
_MAX_LINE = 4096
_MAX_TRAILER = 16384
_HEX_DIGITS = b"0123456789abcdefABCDEF"
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # HTAB is allowed in values


class StrictChunks:
    """Decodes one chunked body: `data` gets each piece of chunk data, `finish` the bytes after
    the body (a pipelined request) once it ended, `declared` each chunk's size before its data
    (False: the body was refused, stop), `refuse` why the framing is bad (then nothing else is
    read)."""

    def __init__(
        self,
        data: Callable[[bytes], None],
        finish: Callable[[bytes], None],
        declared: Callable[[int], bool],
        refuse: Callable[[str], None],
    ) -> None:
        self._data = data
        self._finish = finish
        self._declared = declared
        self._refuse = refuse
        self._buffer = bytearray()
        self._state = "size"  # size, data, crlf, trailer; done or failed: read nothing more
        self._left = 0  # bytes of the current chunk's data still to come
        self._trailer = 0  # bytes of trailer fields so far

    def dataReceived(self, data: bytes) -> None:
        """Take the next bytes of the body (Twisted's name: its channel calls this)."""
        if self._state == "data" and not self._buffer and len(data) <= self._left:
            self._left -= len(data)  # the common case: chunk data, passed on without a copy
            self._data(data)
            if self._left == 0:
                self._state = "crlf"
            return
        if self._state in ("done", "failed"):
            return
        self._buffer += data
        while self._buffer and self._step():
            pass

    def _step(self) -> bool:
        """One step on the buffer; False when it needs more bytes or reading is over."""
        if self._state == "data":
            take = min(self._left, len(self._buffer))
            piece = memoryview(self._buffer)[:take].tobytes()
            del self._buffer[:take]
            self._left -= take
            if self._left == 0:
                self._state = "crlf"
            self._data(piece)
            return True
        if self._state == "crlf":
            if self._buffer[:2] == b"\r\n":
                del self._buffer[:2]
                self._state = "size"
                return True
            if self._buffer == b"\r":
                return False
            return self._fail("chunk data is not followed by CRLF")
        line = self._line()
        if line is None:
            return False
        if self._state == "size":
            return self._size(line)
        return self._trailer_field(line)

    def _line(self) -> bytes | None:
        """The next line without its CRLF; None while it has not all arrived, or when it is
        refused (a bare LF, too long)."""
        end = self._buffer.find(b"\n")
        if end == -1:
            if len(self._buffer) > _MAX_LINE:
                self._fail("a line of the chunked body is longer than 4 KiB")
            return None
        if end == 0 or self._buffer[end - 1] != 0x0D:
            self._fail("a line of the chunked body ends in a bare LF, not CRLF")
            return None
        if end > _MAX_LINE:
            self._fail("a line of the chunked body is longer than 4 KiB")
            return None
        line = bytes(self._buffer[: end - 1])
        del self._buffer[: end + 1]
        return line

    def _size(self, line: bytes) -> bool:
        size, semicolon, extensions = line.partition(b";")
        if semicolon:
            size = size.rstrip(b" \t")  # whitespace may come before an extension
        if not size or size.translate(None, _HEX_DIGITS):
            return self._fail(f"the chunk size is not a hex number: {_shown(size)}")
        if len(size.lstrip(b"0")) > 16 or int(size, 16) > _MAX_CHUNK:
            return self._fail(f"the chunk size overflows: {_shown(size)}")
        if _CONTROL.search(extensions):
            return self._fail("a chunk extension holds a control character")
        length = int(size, 16)
        if length == 0:
            self._state = "trailer"
            return True
        if not self._declared(length):
            self._state = "failed"
            self._buffer.clear()
            return False
        self._state, self._left = "data", length
        return True

    def _trailer_field(self, line: bytes) -> bool:
        if not line:  # the empty line that ends the body
            self._state = "done"
            rest = bytes(self._buffer)
            self._buffer.clear()
            self._finish(rest)
            return False
        self._trailer += len(line) + 2
        if self._trailer > _MAX_TRAILER:
            return self._fail("the body's trailer fields are larger than 16 KiB")
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None or _CONTROL.search(value):
            return self._fail(f"a line after the last chunk is not a trailer field: {_shown(line)}")
        return True

    def _fail(self, why: str) -> bool:
        self._state = "failed"
        self._buffer.clear()
        self._refuse(why)
        return False


def _shown(raw: bytes) -> str:
    """Bytes a client sent, short and printable, for an error message."""
    text = raw[:40].decode("latin-1").encode("unicode_escape").decode("ascii")
    return repr(text + ("..." if len(raw) > 40 else ""))
