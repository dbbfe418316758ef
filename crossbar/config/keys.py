"""Client keys (`[keys.<name>]`): who may call which routes and models, and within what limits
(docs/operator-guide.md, "Tenants").

A key's secret is hashed here, as the file is read: the config value holds only its SHA-256,
so nothing that shows a config (`crossbar check`, the admin API, a log line of a value) can show
the secret. `secret_sha256` names the hash directly, for a config that must not hold the
secret at all.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from typing import Any

from attrs import asdict, field, frozen

from crossbar.config.classes import INTERACTIVE, class_error
from crossbar.config.fields import NAME, Errors, Section, quote, type_name
from crossbar.config.limits import WEIGHT_MAX, WEIGHT_MIN

_HEX64 = re.compile(r"[0-9a-f]{64}")
DEFAULT_CACHED_WEIGHT = 0.1
MIN_SECRET = 16  # characters: a shorter secret can be guessed over the network


def hash_secret(secret: str) -> str:
    """The SHA-256 of a key's secret, as hex: what the store and the config keep."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@frozen
class KeyLimits:
    """What a key may spend. None: no limit of that kind. Tokens count prompt + completion,
    a cached prompt token at `cached_weight`."""

    rpm: int | None = None  # requests per minute
    tpm: int | None = None  # tokens per minute
    max_in_flight: int | None = None
    tokens_per_day: int | None = None  # UTC calendar day
    tokens_per_month: int | None = None  # UTC calendar month
    cached_weight: float = DEFAULT_CACHED_WEIGHT
    weight: float | None = None  # its share of its route's slots among the route's keys
    # Its requests' class when they do not say (None: their route's), and the highest class
    # they may claim (config/classes.py).
    request_class: str | None = None
    max_class: str = INTERACTIVE

    def cost(self, prompt: int, cached: int, completion: int) -> float:
        """What a request with these tokens costs the key."""
        cached = max(0, min(cached, prompt))
        return (prompt - cached) + cached * self.cached_weight + completion

    @property
    def any(self) -> bool:
        """Whether any limit is set (else admission is free)."""
        return (
            self.rpm is not None
            or self.tpm is not None
            or self.max_in_flight is not None
            or self.tokens_per_day is not None
            or self.tokens_per_month is not None
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> KeyLimits:
        """The limits a store row keeps (unknown fields are ignored: a newer crossbar's)."""
        if not isinstance(data, dict):
            return cls()
        known = {a for a in asdict(cls())}
        return cls(**{k: v for k, v in data.items() if k in known})


@frozen
class KeyConfig:
    """`[keys.<name>]`: a named client key as the config seeds it into the store."""

    name: str
    sha256: str = field(repr=False)  # of the secret; the secret itself is never kept
    routes: tuple[str, ...] = ()  # route names or globs it may use; () none
    models: tuple[str, ...] = ()  # model names or globs; () any
    expires: float | None = None  # seconds since the epoch
    blocked: bool = False
    limits: KeyLimits = field(factory=KeyLimits)

    def digest(self) -> str:
        """What the config says of the key, digested: a reseed writes only what changed, so
        a rotation or a block made through the admin API survives a restart with the same
        config."""
        data = asdict(self)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


_LIMIT_KEYS = ("rpm", "tpm", "max_in_flight", "tokens_per_day", "tokens_per_month")


def read_limits(table: Section) -> KeyLimits:
    """The limits of a key table (the config's) or of an admin body (through a Section)."""
    values = {key: table.integer(key, None) for key in _LIMIT_KEYS}
    cached = table.raw("cached_weight", DEFAULT_CACHED_WEIGHT)
    if isinstance(cached, bool) or not isinstance(cached, int | float) or not 0 <= cached <= 1:
        table.errors.add(
            table.sub("cached_weight"), f"must be a number from 0 to 1, not {quote(cached)}"
        )
        cached = DEFAULT_CACHED_WEIGHT
    weight = table.positive_number("weight", None, WEIGHT_MIN, WEIGHT_MAX)
    claimed = table.raw("class", None)
    if claimed is not None and class_error(claimed):
        table.errors.add(table.sub("class"), class_error(claimed) or "")
        claimed = None
    most = table.raw("max_class", INTERACTIVE)
    if class_error(most):
        table.errors.add(table.sub("max_class"), class_error(most) or "")
        most = INTERACTIVE
    return KeyLimits(
        **values,
        cached_weight=float(cached),
        weight=weight,
        request_class=claimed,
        max_class=most,
    )


def read_expiry(table: Section, key: str = "expires") -> float | None:
    """A TOML date-time or date (UTC unless it names an offset), or an ISO 8601 string."""
    if not table.has(key):
        return None
    raw = table.raw(key)
    path = table.sub(key)
    if isinstance(raw, str):
        try:
            raw = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            table.errors.add(path, f'must be a date or date-time such as 2027-01-31, not "{raw}"')
            return None
    if isinstance(raw, dt.datetime):
        if raw.tzinfo is None:
            raw = raw.replace(tzinfo=dt.UTC)
        return raw.timestamp()
    if isinstance(raw, dt.date):
        return dt.datetime(raw.year, raw.month, raw.day, tzinfo=dt.UTC).timestamp()
    table.errors.add(path, f"must be a date or date-time, not {type_name(raw)}")
    return None


def read_secret_hash(table: Section) -> str:
    """`secret` (hashed now) or `secret_sha256`: exactly one."""
    has_secret, has_hash = table.has("secret"), table.has("secret_sha256")
    if has_secret == has_hash:
        table.errors.add(
            table.sub("secret"),
            "give exactly one of secret and secret_sha256"
            if has_secret
            else 'missing (secret = "...", or secret_sha256 = the hex SHA-256 of the secret)',
        )
        table.raw("secret", None)
        table.raw("secret_sha256", None)
        return ""
    if has_hash:
        digest = table.string("secret_sha256").lower()
        if not _HEX64.fullmatch(digest):
            table.errors.add(table.sub("secret_sha256"), "must be 64 hex digits (a SHA-256)")
            return ""
        return digest
    secret = table.raw("secret")
    if not isinstance(secret, str) or len(secret) < MIN_SECRET:
        # The value is never shown: it is a secret, however bad.
        table.errors.add(
            table.sub("secret"), f"must be a string of at least {MIN_SECRET} characters"
        )
        return ""
    return hash_secret(secret)


def read_keys(errors: Errors, data: Any) -> dict[str, KeyConfig]:
    """Read `[keys.*]`."""
    keys: dict[str, KeyConfig] = {}
    outer = Section(errors, "keys", data)
    seen: dict[str, str] = {}
    for name in outer.keys():
        table = Section(errors, outer.sub(name), outer.raw(name))
        if NAME.fullmatch(name) is None:
            errors.add(table.path, f"bad key name {quote(name)} (use [a-z0-9][a-z0-9._-]{{0,63}})")
        sha = read_secret_hash(table)
        key = KeyConfig(
            name=name,
            sha256=sha,
            routes=table.string_list("routes"),
            models=table.string_list("models"),
            expires=read_expiry(table),
            blocked=table.boolean("blocked", False),
            limits=read_limits(table),
        )
        table.finish()
        if sha and sha in seen:
            errors.add(table.sub("secret"), f"is the same secret as keys.{seen[sha]}")
        elif sha:
            seen[sha] = name
        keys[name] = key
    return keys


@frozen
class KeySpec:
    """A new key as the admin API is asked for it (POST /api/keys)."""

    name: str
    routes: tuple[str, ...]
    models: tuple[str, ...]
    limits: KeyLimits
    expires: float | None


def read_key_spec(data: Any) -> tuple[KeySpec | None, list[str]]:
    """A new key's fields read as `[keys.<name>]` is (no secret: crossbar makes it), with
    every problem under its field's name."""
    errors = Errors()
    table = Section(errors, "", data)
    name = table.string("name")
    if not name:
        errors.add("name", "missing (the key's name, [a-z0-9][a-z0-9._-]{0,63})")
    elif NAME.fullmatch(name) is None:
        errors.add("name", f"bad key name {quote(name)} (use [a-z0-9][a-z0-9._-]{{0,63}})")
    routes = table.string_list("routes")
    if not routes:
        errors.add("routes", 'missing (the routes or globs the key may use, e.g. ["proj-*"])')
    models = table.string_list("models")
    expires = read_expiry(table)
    limits = read_limits(table)
    table.finish()
    if errors:
        return None, errors.lines
    return KeySpec(name, routes, models, limits, expires), []
