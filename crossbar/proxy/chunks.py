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
    """Decodes one chunked body: `data` gets each piece of chunk data (False: the body was
    refused, stop), `finish` the bytes after the body (a pipelined request) once it ended,
    `declared` each chunk's size before its data (False: refused, stop), `refuse` why the
    framing is bad (then nothing else is read).

    Each read is walked once by position: what is kept between reads is at most a line not
    yet whole (4 KiB), so a read of many small chunks costs a few operations per chunk, never
    a copy of the rest of the read for each."""

    def __init__(
        self,
        data: Callable[[bytes], bool],
        finish: Callable[[bytes], None],
        declared: Callable[[int], bool],
        refuse: Callable[[str], None],
    ) -> None:
        self._data = data
        self._finish = finish
        self._declared = declared
        self._refuse = refuse
        self._kept = b""  # the start of a line (or of a CRLF) that has not all arrived
        self._state = "size"  # size, data, crlf, trailer; done or failed: read nothing more
        self._left = 0  # bytes of the current chunk's data still to come
        self._trailer = 0  # bytes of trailer fields so far

    def dataReceived(self, data: bytes) -> None:
        """Take the next bytes of the body (Twisted's name: its channel calls this)."""
        state = self._state
        if state == "data" and not self._kept and len(data) <= self._left:
            self._left -= len(data)  # the common case: chunk data, passed on without a copy
            if self._left == 0:
                self._state = "crlf"
            if not self._data(data):
                self._state = "failed"
            return
        if state in ("done", "failed"):
            return
        buffer = self._kept + data if self._kept else data
        self._kept = b""
        at = self._walk(buffer)
        if at is not None and self._state not in ("done", "failed"):
            self._kept = buffer[at:]

    def _walk(self, buffer: bytes) -> int | None:
        """Read `buffer` from its start; where the bytes not yet usable begin, or None when
        reading is over (the body ended, or was refused)."""
        at, end = 0, len(buffer)
        while at < end:
            state = self._state
            if state == "data":
                take = min(self._left, end - at)
                piece = buffer if take == end else buffer[at : at + take]
                at += take
                self._left -= take
                if self._left == 0:
                    self._state = "crlf"
                if not self._data(piece):
                    self._state = "failed"
                    return None
            elif state == "crlf":
                pair = buffer[at : at + 2]
                if pair == b"\r\n":
                    at += 2
                    self._state = "size"
                elif pair != b"\r":
                    return self._fail("chunk data is not followed by CRLF")
                else:
                    return at  # the LF is still to come
            else:
                line_end = buffer.find(b"\n", at)
                if line_end == -1:
                    if end - at > _MAX_LINE:
                        return self._fail("a line of the chunked body is longer than 4 KiB")
                    return at
                if line_end == at or buffer[line_end - 1] != 0x0D:
                    return self._fail("a line of the chunked body ends in a bare LF, not CRLF")
                if line_end - at > _MAX_LINE:
                    return self._fail("a line of the chunked body is longer than 4 KiB")
                line = buffer[at : line_end - 1]
                at = line_end + 1
                if state == "size":
                    if not self._size(line):
                        return None
                elif not line:  # the empty line that ends the body
                    self._state = "done"
                    self._finish(buffer[at:])
                    return None
                elif not self._trailer_field(line):
                    return None
        return at

    def _size(self, line: bytes) -> bool:
        size, semicolon, extensions = line.partition(b";")
        if semicolon:
            size = size.rstrip(b" \t")  # whitespace may come before an extension
            if _CONTROL.search(extensions):
                self._fail("a chunk extension holds a control character")
                return False
        if not size or size.translate(None, _HEX_DIGITS):
            self._fail(f"the chunk size is not a hex number: {_shown(size)}")
            return False
        length = int(size, 16) if len(size.lstrip(b"0")) <= 16 else _MAX_CHUNK + 1
        if length > _MAX_CHUNK:
            self._fail(f"the chunk size overflows: {_shown(size)}")
            return False
        if length == 0:
            self._state = "trailer"
            return True
        if not self._declared(length):
            self._state = "failed"
            return False
        self._state, self._left = "data", length
        return True

    def _trailer_field(self, line: bytes) -> bool:
        self._trailer += len(line) + 2
        if self._trailer > _MAX_TRAILER:
            self._fail("the body's trailer fields are larger than 16 KiB")
            return False
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None or _CONTROL.search(value):
            self._fail(f"a line after the last chunk is not a trailer field: {_shown(line)}")
            return False
        return True

    def _fail(self, why: str) -> None:
        self._state = "failed"
        self._kept = b""
        self._refuse(why)


def _shown(raw: bytes) -> str:
    """Bytes a client sent, short and printable, for an error message."""
    text = raw[:40].decode("latin-1").encode("unicode_escape").decode("ascii")
    return repr(text + ("..." if len(raw) > 40 else ""))
