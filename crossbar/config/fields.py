"""Typed readers for config tables that collect every error under its dotted path."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from crossbar.config.units import parse_duration, parse_size

NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_MISSING = object()


def valid_name(name: str) -> bool:
    """Host, route and key names are `[a-z0-9][a-z0-9._-]{0,63}`."""
    return NAME.fullmatch(name) is not None


def key_path(path: str, key: str) -> str:
    """`path.key`, with the key quoted as TOML would need it (`aliases."claude-*"`)."""
    shown = key if _BARE_KEY.fullmatch(key) else json.dumps(key)
    return f"{path}.{shown}" if path else shown


def quote(value: Any) -> str:
    """Render a config value for an error message the way TOML would write it."""
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def type_name(value: Any) -> str:
    """Name a TOML value's type for an error message."""
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def http_url(text: str) -> str:
    """An http(s) URL with a host and no query or fragment (a host's, a collector's), its
    trailing `/` dropped; ValueError saying which of those it is not."""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL")
    try:
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise ValueError("not an http(s) URL (bad port)") from None
    if parts.query or parts.fragment:
        raise ValueError("must not have a query or fragment")
    return text.rstrip("/")


class Errors:
    """An ordered list of "dotted.path: message" lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.lines.append(f"{path}: {message}")

    def __bool__(self) -> bool:
        return bool(self.lines)


class Section:
    """One TOML table being read (a config section): each `take` consumes a key; `finish` reports
    the rest as unknown."""

    def __init__(self, errors: Errors, path: str, data: Any) -> None:
        self.errors = errors
        self.path = path
        if not isinstance(data, dict):
            errors.add(path, f"must be a table, not {type_name(data)}")
            data = {}
        self._data = dict(data)

    def sub(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def keys(self) -> list[str]:
        return list(self._data)

    def has(self, key: str) -> bool:
        return key in self._data

    def peek(self, key: str) -> Any:
        """The value of `key` (None when missing), left to be taken."""
        return self._data.get(key)

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        return self._data.pop(key, default)

    def _take(self, key: str, default: Any, check: Callable[[Any], Any]) -> Any:
        value = self._data.pop(key, _MISSING)
        if value is _MISSING:
            return default
        try:
            return check(value)
        except ValueError as e:
            self.errors.add(self.sub(key), str(e))
            return default

    def string(self, key: str, default: str = "") -> str:
        def check(v: Any) -> str:
            if not isinstance(v, str):
                raise ValueError(f"must be a string, not {type_name(v)}")
            return v

        return self._take(key, default, check)

    def boolean(self, key: str, default: bool) -> bool:
        def check(v: Any) -> bool:
            if not isinstance(v, bool):
                raise ValueError(f"must be true or false, not {quote(v)}")
            return v

        return self._take(key, default, check)

    def integer(self, key: str, default: Any, minimum: int = 1, maximum: int | None = None) -> Any:
        def check(v: Any) -> int:
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"must be an integer, not {type_name(v)}")
            if v < minimum:
                raise ValueError(f"must be at least {minimum}, not {v}")
            if maximum is not None and v > maximum:
                raise ValueError(f"must be at most {maximum}, not {v}")
            return v

        return self._take(key, default, check)

    def positive_number(self, key: str, default: Any, minimum: float, maximum: float) -> Any:
        """An integer or a float larger than zero, within [minimum, maximum]."""

        def check(v: Any) -> float:
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"must be a number, not {type_name(v)} {quote(v)}")
            if math.isnan(v):
                raise ValueError("must be a number, not nan")
            if v <= 0:
                raise ValueError(f"must be larger than zero, not {v:g}")
            if v < minimum:
                raise ValueError(f"must be at least {minimum:g}, not {v:g}")
            if v > maximum:
                raise ValueError(f"must be at most {maximum:g}, not {v:g}")
            return float(v)

        return self._take(key, default, check)

    def duration(self, key: str, default: float, positive: bool = True) -> float:
        def check(v: Any) -> float:
            if not isinstance(v, str):
                raise ValueError(
                    f'must be a duration string such as "90s", not {type_name(v)} {quote(v)}'
                )
            seconds = parse_duration(v)
            if positive and seconds <= 0:
                raise ValueError(f"must be longer than zero, not {quote(v)}")
            return seconds

        return self._take(key, default, check)

    def duration_or_off(self, key: str, default: float | None) -> float | None:
        """A duration longer than zero, or `false`: never (None)."""

        def check(v: Any) -> float | None:
            if v is False:
                return None
            if not isinstance(v, str):
                raise ValueError(
                    f'must be a duration string such as "200ms", or false, not {type_name(v)} '
                    f"{quote(v)}"
                )
            seconds = parse_duration(v)
            if seconds <= 0:
                raise ValueError(f"must be longer than zero (false: never), not {quote(v)}")
            return seconds

        return self._take(key, default, check)

    def size(self, key: str, default: int, minimum: int = 1) -> int:
        def check(v: Any) -> int:
            n = parse_size(v)
            if n < minimum:
                raise ValueError(f"must be larger than zero, not {quote(v)}")
            return n

        return self._take(key, default, check)

    def string_list(self, key: str, default: Any = ()) -> Any:
        def check(v: Any) -> tuple[str, ...]:
            if not isinstance(v, list):
                raise ValueError(f"must be an array of strings, not {type_name(v)}")
            bad = [x for x in v if not isinstance(x, str) or not x]
            if bad:
                raise ValueError(f"must hold only non-empty strings, not {quote(bad[0])}")
            return tuple(v)

        return self._take(key, default, check)

    def string_table(self, key: str) -> tuple[tuple[str, str], ...]:
        """A table of strings to strings, in file order; each bad entry is reported under its
        own dotted path and left out."""
        raw = self._data.pop(key, _MISSING)
        if raw is _MISSING:
            return ()
        path = self.sub(key)
        if not isinstance(raw, dict):
            self.errors.add(path, f"must be a table of strings, not {type_name(raw)}")
            return ()
        pairs = []
        for name, value in raw.items():
            if not name:
                self.errors.add(path, "has an empty key")
            elif not isinstance(value, str) or not value:
                self.errors.add(
                    key_path(path, name), f"must be a non-empty string, not {quote(value)}"
                )
            else:
                pairs.append((name, value))
        return tuple(pairs)

    def url(self, key: str) -> str:
        def check(v: Any) -> str:
            if not isinstance(v, str):
                raise ValueError(f"not an http(s) URL: {type_name(v)}")
            try:
                return http_url(v)
            except ValueError as e:
                raise ValueError(f"{e}: {quote(v)}") from None

        if not self.has(key):
            self.errors.add(self.sub(key), "missing (the base URL of the llama-server)")
            return ""
        return self._take(key, "", check)

    def finish(self) -> None:
        """Report every key nobody took as unknown."""
        for key in self._data:
            self.errors.add(self.sub(key), "unknown key")


def origin_error(value: str) -> str | None:
    """Why `value` is not a `cors_origins` entry (`*`, or `scheme://host[:port]`), or None."""
    if value == "*":
        return None
    parts = urlsplit(value)
    try:
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        return f'"{value}" has a bad port'
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f'"{value}" is not an origin: use scheme://host[:port] (or "*" for any)'
    if parts.path or parts.query or parts.fragment or parts.username is not None:
        return f'"{value}" is not an origin: no path, query or user (browsers send none)'
    return None
