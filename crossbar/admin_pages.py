"""Paged, filtered answers of the admin API (`/api/leases`, `/api/routes`), built without
stalling the proxy.

A page of 100 leases out of 100,000 is chosen by scanning every key, so the scan runs in
chunks of CHUNK keys and gives the reactor back between chunks (a zero-delay call on the
injected clock): a proxy request waits at most one chunk, never the whole scan. Pages are in
key order (route, fp, model); the cursor is the last key of the page given, so the next page
starts after it even when leases came and went meanwhile.
"""

from __future__ import annotations

import base64
import heapq
import json
import re
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from attrs import frozen
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater

from crossbar.errors import bad_request
from crossbar.lease import Lease, Table
from crossbar.lease_types import Key

_sort_key = attrgetter("route", "fp", "model")  # a Key as a tuple, in C
CHUNK = 1000  # keys scanned per turn of the reactor (1-2 ms on a busy 2-core VM)
LeaseSortKey = tuple[str, str, str]


async def breathe(clock: IReactorTime) -> None:
    """Let the reactor run whatever is due (I/O, timers) before going on."""
    await deferLater(clock, 0, lambda: None)


def encode_cursor(value: Any) -> str:
    """An opaque cursor for `value` (JSON, base64url)."""
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def decode_cursor(text: str | None, check: Callable[[Any], bool]) -> Any:
    """The value of a cursor this API gave, or None for no cursor; anything else is a 400."""
    if text is None:
        return None
    try:
        value = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except ValueError:
        value = None
    if value is None or not check(value):
        raise bad_request(f"cursor: give the `next` value of an earlier answer, not {text!r}")
    return value


@frozen
class LeaseFilter:
    """Which leases a page shows: each field None for any; `fp` matches a prefix."""

    route: str | None = None
    host: str | None = None
    model: str | None = None
    fp: str | None = None

    def matches(self, lease: Lease) -> bool:
        key = lease.key
        return (
            (self.host is None or lease.host == self.host)
            and (self.model is None or key.model == self.model)
            and (self.fp is None or key.fp.startswith(self.fp))
            and (self.route is None or key.route == self.route)
        )


@frozen
class Page:
    """Some rows, how many matched in all, and the cursor of the next page (None: the last)."""

    rows: list[Any]
    total: int
    next: str | None


def _is_key(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 3 and all(isinstance(v, str) for v in value)


async def lease_page(
    table: Table, clock: IReactorTime, where: LeaseFilter, cursor: str | None, limit: int
) -> Page:
    """The first `limit` leases matching `where` after `cursor`, in key order."""
    after = decode_cursor(cursor, _is_key)
    start: LeaseSortKey | None = tuple(after) if after is not None else None  # type: ignore[assignment]
    keys = table.keys(where.route)
    best: list[LeaseSortKey] = []
    plain = where.host is None and where.model is None and where.fp is None
    total = len(keys) if plain else 0
    later = 0
    step = CHUNK * 4 if plain else CHUNK  # no lease to read per key: four times as many
    for i in range(0, len(keys), step):
        if i:
            await breathe(clock)
        if plain:  # every key counts: only the order is asked
            found = [k for k in map(_sort_key, keys[i : i + step]) if start is None or k > start]
        else:
            found = []
            for key in keys[i : i + step]:
                lease = table.lease(key)
                if lease is None or not where.matches(lease):
                    continue  # gone while we gave the reactor back, or filtered out
                total += 1
                k = _sort_key(key)
                if start is None or k > start:
                    found.append(k)
        later += len(found)
        best = heapq.nsmallest(limit, best + found)
    rows = []
    for route, fp, model in best:
        lease = table.lease(Key(route, fp, model))
        if lease is not None:
            rows.append(lease)
    more = later > limit
    return Page(rows, total, encode_cursor(list(best[-1])) if more and best else None)


# -- routes


ROUTE_SORTS = ("name", "requests", "leases")


def natural(name: str) -> tuple[Any, ...]:
    """A sort key putting team-2 before team-10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _is_offset(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def route_page(
    rows: list[dict[str, Any]],
    search: str | None,
    host: str | None,
    model: str | None,
    sort: str,
    cursor: str | None,
    limit: int,
) -> Page:
    """Route rows filtered (`search`: part of the name; `host`: one of its hosts or holding
    leases there; `model`: its default model), sorted (`name`: configured routes first in
    config order, then the others in natural order; `requests`, `leases`: most first), paged."""
    offset = decode_cursor(cursor, _is_offset) or 0
    picked = [
        r
        for r in rows
        if (search is None or search in r["name"])
        and (host is None or host in r["hosts"] or host in r["leases_by_host"])
        and (model is None or r["default_model"] == model)
    ]
    if sort != "name":
        picked.sort(key=lambda r: (-(r[sort] or 0), natural(r["name"])))
    page = picked[offset : offset + limit]
    more = offset + limit < len(picked)
    return Page(page, len(picked), encode_cursor(offset + limit) if more else None)
