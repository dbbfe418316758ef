"""A named client key as crossbar keeps it (the store's row), and the refusals of a key."""

from __future__ import annotations

import re
from fnmatch import translate
from typing import Any

from attrs import field, frozen

from crossbar.config import KeyConfig, KeyLimits

CONFIG = "config"  # seeded from `[keys.<name>]`
API = "api"  # made through the admin API


def _globs(globs: tuple[str, ...]) -> re.Pattern[str]:
    """One pattern matching what any of the shell-style `globs` matches, as fnmatchcase does
    (case-sensitive, the whole name); none: matches nothing."""
    if not globs:
        return re.compile(r"(?!)")
    return re.compile("|".join(f"(?:{translate(glob)})" for glob in globs))


@frozen
class ClientKey:
    """One named key: the hash of its secret (never the secret), what it may use, its limits.

    After a rotation the previous secret's hash stays valid until `old_until` (the grace)."""

    name: str
    sha256: str = field(repr=False)
    routes: tuple[str, ...] = ()  # route names or shell-style globs
    models: tuple[str, ...] = ()  # () any model
    expires: float | None = None
    blocked: bool = False
    limits: KeyLimits = field(factory=KeyLimits)
    created: float = 0.0
    source: str = API
    seed: str = ""  # the digest of the config entry it was seeded from
    old_sha256: str = field(default="", repr=False)
    old_until: float = 0.0

    # The scopes as one pattern each, made once per key (a check per request).
    _routes_re: re.Pattern[str] = field(init=False, eq=False, repr=False)
    _models_re: re.Pattern[str] | None = field(init=False, eq=False, repr=False)

    @_routes_re.default
    def _compile_routes(self) -> re.Pattern[str]:
        return _globs(self.routes)

    @_models_re.default
    def _compile_models(self) -> re.Pattern[str] | None:
        return _globs(self.models) if self.models else None

    def covers_route(self, route: str) -> bool:
        """Whether the key may use `route` (its `routes` name it or a glob of them matches)."""
        return self._routes_re.match(route) is not None

    def covers_model(self, model: str) -> bool:
        """Whether the key may ask for `model` (no `models`: any)."""
        return self._models_re is None or self._models_re.match(model) is not None

    def expired(self, now: float) -> bool:
        return self.expires is not None and now >= self.expires


def from_config(config: KeyConfig, now: float) -> ClientKey:
    """The store row a `[keys.<name>]` table seeds."""
    return ClientKey(
        name=config.name,
        sha256=config.sha256,
        routes=config.routes,
        models=config.models,
        expires=config.expires,
        blocked=config.blocked,
        limits=config.limits,
        created=now,
        source=CONFIG,
        seed=config.digest(),
    )


def key_view(key: ClientKey, now: float) -> dict[str, Any]:
    """A key as the admin API shows it: everything but its secret and the secret's hash."""
    return {
        "name": key.name,
        "routes": list(key.routes),
        "models": list(key.models),
        "expires": key.expires,
        "expired": key.expired(now),
        "blocked": key.blocked,
        "limits": key.limits.to_json(),
        "created": key.created,
        "source": key.source,
        "previous_secret_valid_until": key.old_until if key.old_until > now else None,
    }


class KeyRefused(Exception):
    """A request's key may not do this: `status` 401 (unknown, blocked, expired) or 403
    (outside its routes or models); the message tells the client what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class OverLimit(Exception):
    """A key over one of its limits (`limit`: rpm, tpm, max_in_flight, tokens_per_day,
    tokens_per_month); `retry_after` seconds until it may fit."""

    def __init__(self, key: str, limit: str, retry_after: float, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.limit = limit
        self.retry_after = retry_after
        self.message = message
