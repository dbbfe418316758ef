"""Lease pages, whatever the table and the filter: following the cursors gives every matching
lease once, in key order, with the total the counters tell; a cursor from anywhere (another
route, a route gone) goes on after its key; leases coming and going while a page gives the
reactor back never make a page repeat, reorder or skip a lease that stayed. Pins are never
leases. CHUNK is made small so that big routes (scanned in chunks) mix with small ones."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.defer import ensureDeferred
from twisted.internet.task import Clock

from crossbar.admin import pages as admin_pages
from crossbar.admin.pages import LeaseFilter, encode_cursor, lease_page
from crossbar.leases.table import Key, Lease, State, Table
from tests.support.lease_fakes import empty_table

FIXTURE = [HealthCheck.function_scoped_fixture]  # CHUNK is the same for every example
ROUTES = ("a", "b", "b2", "c", "d")
lease_st = st.builds(
    lambda r, fp, m, h: Lease(Key(r, fp, m), h, State.ACTIVE, 1.0, 1.0),
    st.sampled_from(ROUTES),
    st.text("xyz", min_size=1, max_size=3),
    st.sampled_from(("m1", "m2")),
    st.sampled_from(("h1", "h2")),
)
filter_st = st.builds(
    LeaseFilter,
    route=st.sampled_from((None, *ROUTES, "zz", "")),
    host=st.sampled_from((None, "h1", "h2", "h3")),
    model=st.sampled_from((None, "m1", "m2", "")),
    fp=st.sampled_from((None, "", "x", "xy")),
)
cursor_st = st.one_of(
    st.none(),
    st.tuples(
        st.sampled_from(("", *ROUTES, "a0", "bb", "zz")),
        st.text("xyz", max_size=3),
        st.sampled_from(("", "m1", "m2", "m3")),
    ),
)


class Turns(Clock):
    """A clock whose zero-delay calls run when the test turns the reactor, after `between`."""

    def __init__(self) -> None:
        super().__init__()
        self.due: list = []

    def callLater(self, delay, f, *args, **kw):
        self.due.append((f, args, kw))
        return super().callLater(delay, lambda: None)

    def run(self, d, between=lambda: None):
        while not d.called:
            between()
            f, args, kw = self.due.pop(0)
            f(*args, **kw)
        return d.result


def table_of(leases: list[Lease], pins=("a", "c")) -> Table:
    table = empty_table()
    held = {lease.key: lease for lease in leases}
    pinned = [Lease(Key(route, "", ""), "h1", State.PINNED, 1.0, 1.0) for route in pins]
    table.memory.replace_all([*held.values(), *pinned])
    return table


def pages(table, where, limit, cursor=None, between=lambda: None):
    """Every page from `cursor` on: (keys shown, totals)."""
    clock, keys, totals = Turns(), [], set()
    while True:
        page = clock.run(ensureDeferred(lease_page(table, clock, where, cursor, limit)), between)
        assert len(page.rows) <= limit
        keys += [lease.key for lease in page.rows]
        totals.add(page.total)
        cursor = page.next
        if cursor is None:
            return keys, totals


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(admin_pages, "CHUNK", 4)


@settings(max_examples=400, deadline=None, suppress_health_check=FIXTURE)
@given(st.lists(lease_st, max_size=40), filter_st, st.integers(1, 6), cursor_st)
def test_pages_give_every_match_after_the_cursor_once_in_order(leases, where, limit, start):
    table = table_of(leases)
    held = {lease.key: lease for lease in leases}
    want = sorted(k for k, lease in held.items() if where.matches(lease))
    cursor = encode_cursor(list(start)) if start is not None else None
    keys, totals = pages(table, where, limit, cursor)
    assert keys == [k for k in want if start is None or tuple(k) > start]
    assert totals == {len(want)}


@settings(max_examples=200, deadline=None, suppress_health_check=FIXTURE)
@given(st.lists(lease_st, max_size=40), filter_st)
def test_the_counters_count_what_a_scan_counts(leases, where):
    table = table_of(leases)
    held = {lease.key: lease for lease in leases}
    for route in (where.route, None):
        for host in (where.host, None):
            for model in (where.model, None):
                f = LeaseFilter(route, host, model)
                want = sum(f.matches(lease) for lease in held.values())
                assert table.count_where(route, host, model) == want, f


@settings(max_examples=300, deadline=None, suppress_health_check=FIXTURE)
@given(
    st.lists(lease_st, max_size=40),
    filter_st,
    st.integers(1, 6),
    st.lists(st.tuples(st.booleans(), lease_st), max_size=20),
)
def test_leases_coming_and_going_between_chunks_never_repeat_or_skip_one_that_stayed(
    leases, where, limit, changes
):
    table = table_of(leases)
    stayed = {lease.key for lease in leases}
    todo = list(changes)

    def between():  # one lease comes or goes each time the reactor gets a turn
        if todo:
            add, lease = todo.pop(0)
            stayed.discard(lease.key)
            if add:
                table.memory.adopt(lease.key, lease, 0)
            else:
                table.memory.adopt(lease.key, None, 0)

    keys, _ = pages(table, where, limit, None, between)
    assert keys == sorted(set(keys))  # in order, none twice
    first = {lease.key: lease for lease in leases}
    missing = [k for k in stayed if where.matches(first[k]) and k not in keys]
    assert not missing
