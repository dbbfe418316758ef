"""What a request head's lines say of the request's framing, before any of it is taken:
its body's length or chunking, its Connection tokens and its Host, with why a head two parsers
could read two ways (the raw material of request smuggling) or RFC 9112 forbids is refused;
and the path of a target in absolute form. The channel (channel.py) reads heads with llhttp
and asks these."""

from __future__ import annotations


def framing(
    headers: list[tuple[bytes, bytes]], version: bytes
) -> tuple[str | None, int, bool, set[bytes]]:
    """(why the head's framing cannot be taken or None, its Content-Length, chunked, the
    Connection tokens), its headers read once: Transfer-Encoding, Content-Length, and Host
    (RFC 9112, 3.2: an HTTP/1.1 request has exactly one, an HTTP/1.0 request at most one)."""
    length, chunked, encodings, lengths, hosts = 0, False, 0, 0, 0
    tokens: set[bytes] = set()
    for name, value in headers:
        low = name.lower()
        if low == b"host":
            hosts += 1
        elif low == b"content-length":
            lengths += 1
            length = int(value)  # llhttp took it: digits, and one value however repeated
        elif low == b"transfer-encoding":
            encodings += 1
            if encodings > 1:
                return "the request has more than one Transfer-Encoding header", 0, False, tokens
            if version != b"HTTP/1.1":
                shown = version.decode("latin-1")
                return (
                    f"Transfer-Encoding on an {shown} request: a chunked body needs HTTP/1.1",
                    0,
                    False,
                    tokens,
                )
            if value.strip(b" \t").lower() != b"chunked":
                shown = value.decode("latin-1")[:40]
                return f"Transfer-Encoding {shown!r}: crossbar takes only chunked", 0, False, tokens
            chunked = True
        elif low == b"connection":
            tokens.update(t.strip().lower() for t in value.split(b","))
    if chunked and lengths:
        return "a request may not have both Transfer-Encoding and Content-Length", 0, False, tokens
    if hosts > 1:
        return f"the request has {hosts} Host headers: send one", 0, False, tokens
    if not hosts and version == b"HTTP/1.1":
        return "an HTTP/1.1 request must have a Host header", 0, False, tokens
    return None, length, chunked, tokens


def origin_form(target: bytes) -> tuple[bytes, bytes | None]:
    """The path and query of a request target, and the authority when it came in absolute
    form (`http://host/path?query`, RFC 9112, 3.2.2), else None."""
    scheme, sep, rest = target.partition(b"://")
    if not sep or scheme.lower() not in (b"http", b"https"):
        return target, None
    cut = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    if not path.startswith(b"/"):
        path = b"/" + path
    return path, authority


def not_http(error: Exception, headers: list[tuple[bytes, bytes]]) -> str:
    """Why llhttp refused a head, in a client's terms (the smuggling shapes by name)."""
    names = {name.lower() for name, _ in headers}
    if b"transfer-encoding" in names:
        if b"content-length" in names:
            return "a request may not have both Transfer-Encoding and Content-Length"
        return "the request's Transfer-Encoding cannot be taken: crossbar takes only chunked"
    detail = str(error).strip() or "unreadable head"
    return f"the request is not valid HTTP/1.1 ({detail})"
