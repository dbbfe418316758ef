"""`multipart/form-data` as OpenAI's SDKs upload a file (RFC 7578): the parts' names, filenames
and contents. Read by splitting on the boundary (bytes operations in C), never by the email
package's parser, which takes seconds of the reactor for a large file."""

from __future__ import annotations

from attrs import frozen


class FormError(ValueError):
    """The body is not the form it says it is; the message says why."""


@frozen
class Part:
    """One field of the form."""

    name: str
    filename: str | None
    content: bytes


def _params(value: str) -> tuple[str, dict[str, str]]:
    head, *rest = value.split(";")
    params = {}
    for item in rest:
        name, sep, raw = item.strip().partition("=")
        if sep:
            raw = raw.strip()
            if len(raw) >= 2 and raw[0] == raw[-1] == '"':
                raw = raw[1:-1].replace('\\"', '"').replace("\\\\", "\\")
            params[name.strip().lower()] = raw
    return head.strip().lower(), params


def parse_form(content_type: str, body: bytes) -> dict[str, Part]:
    """The form's parts by name (the first of each name)."""
    kind, params = _params(content_type)
    if kind != "multipart/form-data":
        raise FormError(f"send the file as multipart/form-data, not {kind or 'no content type'}")
    boundary = params.get("boundary", "")
    if not boundary or len(boundary) > 200:
        raise FormError("the multipart/form-data content type has no boundary")
    delimiter = b"--" + boundary.encode("latin-1")
    pieces = body.split(delimiter)
    if len(pieces) < 3 or not pieces[-1].startswith(b"--"):
        raise FormError("the form is cut short: its closing boundary is missing")
    parts: dict[str, Part] = {}
    for piece in pieces[1:-1]:
        if not piece.startswith(b"\r\n"):
            raise FormError("a boundary of the form is not followed by a line break")
        head, sep, content = piece[2:].partition(b"\r\n\r\n")
        if not sep or not content.endswith(b"\r\n"):
            raise FormError("a part of the form has no headers or no end")
        headers = {}
        for line in head.decode("utf-8", "replace").split("\r\n"):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        disposition, fields = _params(headers.get("content-disposition", ""))
        if disposition != "form-data" or "name" not in fields:
            raise FormError("a part of the form has no Content-Disposition: form-data name")
        parts.setdefault(fields["name"], Part(fields["name"], fields.get("filename"), content[:-2]))
    return parts
