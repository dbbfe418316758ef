"""Tenants: named client keys (their scopes, blocks, expiry and rotation: `book.py`), what each
may spend and has spent, charged before a request runs (`meter.py`), their values and the
refusals the proxy answers (`values.py`)."""

from crossbar.tenants.book import KeyBook, new_secret
from crossbar.tenants.keeper import SYNC_EVERY, KeyActionRefused, KeyStore, Tenants
from crossbar.tenants.meter import ALONE, KeyMeter, Reservation, Share, period_ids
from crossbar.tenants.values import (
    API,
    CONFIG,
    ClientKey,
    KeyRefused,
    OverLimit,
    from_config,
    key_view,
)

__all__ = [
    "ALONE",
    "API",
    "CONFIG",
    "SYNC_EVERY",
    "ClientKey",
    "KeyActionRefused",
    "KeyBook",
    "KeyMeter",
    "KeyRefused",
    "KeyStore",
    "OverLimit",
    "Reservation",
    "Share",
    "Tenants",
    "from_config",
    "key_view",
    "new_secret",
    "period_ids",
]
