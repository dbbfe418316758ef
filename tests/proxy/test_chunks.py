"""The strict chunked decoder reads every valid chunked body however its bytes are split, and
refuses each lenient framing however its bytes are split (hypothesis)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from crossbar.proxy.chunks import StrictChunks


class Decoded:
    """What a decoder handed on."""

    def __init__(self, taken: bool = True) -> None:
        self.data: list[bytes] = []
        self.finished: list[bytes] = []
        self.declared: list[int] = []
        self.refused: list[str] = []
        self.decoder = StrictChunks(
            self._data, self.finished.append, self._declare, self.refused.append
        )
        self._taken = taken

    def _data(self, piece: bytes) -> bool:
        self.data.append(piece)
        return True

    def _declare(self, length: int) -> bool:
        self.declared.append(length)
        return self._taken

    def feed(self, raw: bytes, cuts: list[int]) -> "Decoded":
        """`raw` in pieces cut at `cuts`; once the body ended, the channel keeps what comes
        (here: `finished`), as Twisted's does."""
        start = 0
        for cut in [*sorted({c % (len(raw) + 1) for c in cuts}), len(raw)]:
            if self.finished:
                self.finished.append(raw[start:cut])
            else:
                self.decoder.dataReceived(raw[start:cut])
            start = cut
        return self


def splits():
    return st.lists(st.integers(min_value=0, max_value=10_000), max_size=8)


@st.composite
def chunked_bodies(draw):
    pieces = draw(st.lists(st.binary(min_size=1, max_size=300), max_size=6))
    raw = b""
    for piece in pieces:
        size = b"%x" % len(piece)
        size = draw(st.sampled_from([size, size.upper(), b"000" + size]))
        ext = draw(st.sampled_from([b"", b";a=b", b' ;name="quoted value"']))
        raw += size + ext + b"\r\n" + piece + b"\r\n"
    raw += b"0\r\n"
    trailers = draw(st.lists(st.sampled_from([b"X-Sum: 12", b'Etag:\t"v1"']), max_size=2))
    raw += b"".join(t + b"\r\n" for t in trailers) + b"\r\n"
    return pieces, raw


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    body=chunked_bodies(), after=st.sampled_from([b"", b"GET / HTTP/1.1\r\n\r\n"]), cuts=splits()
)
def test_a_valid_chunked_body_decodes_whole_however_it_is_split(body, after, cuts):
    pieces, raw = body
    decoded = Decoded().feed(raw + after, cuts)
    assert decoded.refused == []
    assert b"".join(decoded.data) == b"".join(pieces)
    assert decoded.declared == [len(p) for p in pieces]
    assert decoded.finished and b"".join(decoded.finished) == after


BAD = [
    (b"5\nhello\r\n0\r\n\r\n", "bare LF"),
    (b"5\r\nhello\n0\r\n\r\n", "not followed by CRLF"),
    (b"5\r\nhelloXX0\r\n\r\n", "not followed by CRLF"),
    (b"0\r\n\n", "bare LF"),
    (b"0x5\r\nhello\r\n0\r\n\r\n", "not a hex number"),
    (b"-5\r\nhello\r\n0\r\n\r\n", "not a hex number"),
    (b" 5\r\nhello\r\n0\r\n\r\n", "not a hex number"),
    (b"1_0\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n", "not a hex number"),
    (b"\r\nhello\r\n0\r\n\r\n", "not a hex number"),
    (b"8000000000000000\r\n", "overflows"),
    (b"10000000000000000000\r\n", "overflows"),
    (b"5;a\x01b\r\nhello\r\n0\r\n\r\n", "control character"),
    (b"0\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n", "not a trailer field"),
    (b"0\r\nX-A: 1\r\n  folded\r\n\r\n", "not a trailer field"),
    (b"0\r\nX-A: 1\x00\r\n\r\n", "not a trailer field"),
    (b"1" * 5000, "longer than 4 KiB"),
]


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(case=st.sampled_from(BAD), cuts=splits())
def test_a_lenient_framing_is_refused_however_it_is_split(case, cuts):
    raw, why = case
    decoded = Decoded().feed(raw, cuts)
    assert len(decoded.refused) == 1 and why in decoded.refused[0]
    assert decoded.finished == []


def test_trailer_fields_past_16_kib_are_refused():
    field = b"X-A: " + b"b" * 4000 + b"\r\n"
    decoded = Decoded().feed(b"0\r\n" + field * 5 + b"\r\n", [])
    assert decoded.refused == ["the body's trailer fields are larger than 16 KiB"]


def test_a_chunk_its_reader_cannot_take_stops_the_body_before_its_data():
    decoded = Decoded(taken=False).feed(b"5\r\nhello\r\n0\r\n\r\n", [])
    assert decoded.declared == [5] and decoded.data == [] and decoded.finished == []
    assert decoded.refused == []  # the reader said why itself
    decoded.decoder.dataReceived(b"more")
    assert decoded.data == []
