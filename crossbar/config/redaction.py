"""URLs as crossbar may show them: a password in one is as secret as an api key; a store's
URL (`server.db`) above all."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def hide_password(url: str) -> str:
    """`url` with any password replaced by `***` (an IPv6 host keeps its brackets)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc, fragment=""))


_POSTGRES_SCHEMES = ("postgresql", "postgres")


def is_postgres(db: str) -> bool:
    """True when `db` is a PostgreSQL URL."""
    return urlsplit(db).scheme in _POSTGRES_SCHEMES


def redact(db: str) -> str:
    """`db` with any password replaced by `***`: what may be shown anywhere."""
    return hide_password(db) if is_postgres(db) else db
