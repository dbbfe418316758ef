"""Header fields on the data path, kept as they came: names as written, looked up without
regard to case, values in order.

`RawHeaders` answers the calls crossbar makes of twisted.web's `Headers` (getRawHeaders,
setRawHeaders, addRawHeader, hasHeader, removeHeader, getAllRawHeaders) for a fraction of
their cost: no name is re-cased or checked per call (llhttp checked what a client or host
sent; crossbar's own names are constants) and a value set by crossbar has its line breaks
folded to spaces, as twisted.web's does, so no value can start a header of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

_NAMES: dict[str, bytes] = {}  # a header name crossbar asks for, to its lower-case key
_MAX_NAMES = 1024


def _key(name: str | bytes) -> bytes:
    return name.lower() if isinstance(name, bytes) else name.lower().encode("latin-1")


def _clean(value: str | bytes) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else value
    if b"\r" in raw or b"\n" in raw:
        return b" ".join(raw.splitlines())
    return raw


class RawHeaders:
    """Header fields: a lower-case name to the name as first written and its values."""

    __slots__ = ("_fields",)

    def __init__(self, pairs: Iterable[tuple[bytes, bytes]] = ()) -> None:
        """`pairs`: (name, value) as a parser read them (checked there, taken as they are)."""
        fields: dict[bytes, tuple[bytes, list[bytes]]] = {}
        for name, value in pairs:
            low = name.lower()
            field = fields.get(low)
            if field is None:
                fields[low] = (name, [value])
            else:
                field[1].append(value)
        self._fields = fields

    def getRawHeaders(self, name: str | bytes, default: Any = None) -> Any:
        """The values of `name` (str values for a str name, as twisted.web gives them), or
        `default`."""
        field = self._fields.get(_key(name))
        if field is None:
            return default
        if isinstance(name, str):
            return [v.decode("utf-8", "replace") for v in field[1]]
        return field[1]

    def last(self, name: str) -> str | None:
        """The last value of `name` as latin-1 text (how `Request.getHeader` reads it), or
        None: header_reader's lookup."""
        key = _NAMES.get(name)
        if key is None:
            key = name.lower().encode("latin-1")
            if len(_NAMES) < _MAX_NAMES:
                _NAMES[name] = key
        field = self._fields.get(key)
        return field[1][-1].decode("latin-1") if field is not None else None

    def keep(self, name: bytes, values: list[bytes]) -> None:
        """Set `name` to `values` that a parser read (checked there: no line breaks)."""
        self._fields[name.lower()] = (name, values)

    def hasHeader(self, name: str | bytes) -> bool:
        return _key(name) in self._fields

    def setRawHeaders(self, name: str | bytes, values: Sequence[str | bytes]) -> None:
        raw = name.encode("latin-1") if isinstance(name, str) else name
        self._fields[raw.lower()] = (raw, [_clean(v) for v in values])

    def addRawHeader(self, name: str | bytes, value: str | bytes) -> None:
        raw = name.encode("latin-1") if isinstance(name, str) else name
        field = self._fields.get(raw.lower())
        if field is None:
            self._fields[raw.lower()] = (raw, [_clean(value)])
        else:
            field[1].append(_clean(value))

    def removeHeader(self, name: str | bytes) -> None:
        self._fields.pop(_key(name), None)

    def getAllRawHeaders(self) -> Iterator[tuple[bytes, list[bytes]]]:
        """(name, values) per field, in the order first set."""
        return iter(self._fields.values())

    def pairs(self) -> Iterator[tuple[bytes, bytes]]:
        """(name, value) per value."""
        for name, values in self._fields.values():
            for value in values:
                yield name, value

    def __repr__(self) -> str:
        return f"RawHeaders({list(self.pairs())!r})"
