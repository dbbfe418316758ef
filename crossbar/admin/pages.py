"""Paged, filtered answers of the admin API (`/api/leases`, `/api/routes`), built without
stalling the proxy.

A page of 100 leases out of 100,000 reads the routes it starts in, in order, and counts the
total from the lease table's counters. What must scan many keys (a fingerprint search, a route
of many thousand leases, a filter few leases match) runs in chunks of CHUNK keys and gives the
reactor back between chunks (a zero-delay call on the injected clock): a proxy request waits
at most one chunk, never the whole scan. Pages are in key order (route, fp, model); the cursor
is the last key of the page given, so the next page starts after it even when leases came and
went meanwhile.
"""

from __future__ import annotations

import base64
import heapq
import json
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

from attrs import frozen
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater

from crossbar.admin.facts import RouteFacts, natural
from crossbar.config import Config, Route
from crossbar.leases import Key, Lease, Table
from crossbar.wire import bad_request

CHUNK = 1000  # keys scanned per turn of the reactor (1-2 ms on a busy 2-core VM)
Start = tuple[str, str, str]  # a cursor's key: the page begins after it


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
    """The first `limit` leases matching `where` after `cursor`, in key order. Without a
    fingerprint search the total comes from the table's counters and the page from the routes
    it starts in (the routes in order, each route's keys sorted): a page of a 100,000-lease
    table reads a route or two, not the table. A fingerprint search scans every key."""
    after = decode_cursor(cursor, _is_key)
    start: Start | None = tuple(after) if after is not None else None  # type: ignore[assignment]
    if where.fp is not None:
        page = await _scanned_page(table, clock, where, start, limit)
        return Page(_leases(table, page.rows), page.total, page.next)
    total = table.count_where(where.route, where.host, where.model)
    routes = [where.route] if where.route is not None else table.routes()
    if start is not None:
        routes = routes[bisect_left(routes, start[0]) :]
    found: list[Key] = []
    read = 0
    for route in routes if total else ():
        if read >= CHUNK:
            await breathe(clock)
            read = 0
        keys = table.keys(route)
        read += len(keys)
        if len(keys) > CHUNK:  # a big route: its own scan, in chunks
            need = limit + 1 - len(found)
            found += (await _scanned_page(table, clock, where, start, need, keys)).rows
        else:
            found += sorted(_matching(table, keys, where, start))[: limit + 1 - len(found)]
        if len(found) > limit:
            break
    rows = _leases(table, found[:limit])
    more = len(found) > limit
    return Page(rows, total, encode_cursor(list(found[limit - 1])) if more else None)


def _matching(table: Table, keys: list[Key], where: LeaseFilter, start: Start | None) -> list[Key]:
    """The keys of `keys` after `start` (a Key is a tuple: it compares as one) whose leases
    match `where`."""
    if where.host is None and where.model is None and where.fp is None:
        return [key for key in keys if start is None or key > start]
    out = []
    for key in keys:
        lease = table.lease(key)
        if lease is None or not where.matches(lease):
            continue  # gone while we gave the reactor back, or filtered out
        if start is None or key > start:
            out.append(key)
    return out


def _leases(table: Table, keys: list[Key]) -> list[Lease]:
    """The leases still held under `keys`."""
    leases = (table.lease(key) for key in keys)
    return [lease for lease in leases if lease is not None]


async def _scanned_page(
    table: Table,
    clock: IReactorTime,
    where: LeaseFilter,
    start: Start | None,
    limit: int,
    keys: list[Key] | None = None,
) -> Page:
    """A page chosen by scanning every key (of `where.route`, or `keys`) in chunks, a reactor
    turn between them; its rows are keys, its total counts every match."""
    if keys is None:
        keys = table.keys(where.route)
    best: list[Key] = []
    total = later = 0
    for i in range(0, len(keys), CHUNK):
        if i:
            await breathe(clock)
        matched = _matching(table, keys[i : i + CHUNK], where, None)
        total += len(matched)
        found = [k for k in matched if start is None or k > start]
        later += len(found)
        best = heapq.nsmallest(limit, best + found)
    more = later > limit
    return Page(best, total, encode_cursor(list(best[-1])) if more and best else None)


# -- routes


ROUTE_SORTS = ("name", "requests", "leases")


def _is_offset(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def route_page(
    config: Config,
    facts: RouteFacts,
    search: str | None,
    host: str | None,
    model: str | None,
    sort: str,
    cursor: str | None,
    limit: int,
) -> Page:
    """The names of a page of routes, filtered (`search`: part of the name; `host`: one of
    its hosts or holding leases there; `model`: its default model), sorted (`name`: configured
    routes first in config order, then the others in natural order; `requests`, `leases`: most
    first). Only a host or model filter looks up every route's config."""
    offset = decode_cursor(cursor, _is_offset) or 0
    picked = [n for n in facts.names if search is None or search in n]
    if host is not None or model is not None:
        picked = [n for n in picked if _route_matches(config.route(n), facts, n, host, model)]
    if sort == "requests":
        picked.sort(key=lambda n: (-facts.requests.get(n, 0), natural(n)))
    elif sort == "leases":
        picked.sort(key=lambda n: (-facts.leases(n), natural(n)))
    page = picked[offset : offset + limit]
    more = offset + limit < len(picked)
    return Page(page, len(picked), encode_cursor(offset + limit) if more else None)


def _route_matches(
    route: Route | None, facts: RouteFacts, name: str, host: str | None, model: str | None
) -> bool:
    hosts = route.hosts if route is not None else ()
    default = route.default_model if route is not None else ""
    return (host is None or host in hosts or host in facts.by_host.get(name, {})) and (
        model is None or default == model
    )
