"""The admin API at fleet scale: the lease table and the routes come a page at a time, with
filters and a cursor, the total told; and a long scan gives the reactor back as it goes."""

import pytest_twisted
from twisted.internet.defer import ensureDeferred
from twisted.internet.task import Clock

from crossbar.admin.pages import CHUNK, LeaseFilter, lease_page
from crossbar.leases.table import Key, Lease, State
from tests.support.admin_harness import conversation, start_service, write_config
from tests.support.harness import MODEL, start_fakes
from tests.support.lease_fakes import empty_table
from tests.support.routes import CONVO

ROUTES = CONVO
TEMPLATES = {"teams": {"match": "team-*", "hosts": ["titan", "atlas"], "default_model": MODEL}}


def fleet(n: int, routes: int = 12) -> list[Lease]:
    """`n` conversations over `routes` template routes, alternately on titan and atlas."""
    return [
        Lease(
            Key(f"team-{i % routes}", f"fp{i:06d}", MODEL),
            ("titan", "atlas")[i % 2],
            State.ACTIVE,
            1.0,
            1.0,
        )
        for i in range(n)
    ]


@pytest_twisted.async_yield_fixture
async def crossbar(tmp_path):
    fakes = await start_fakes("titan", "atlas")
    path = write_config(tmp_path / "crossbar.toml", fakes, ROUTES, templates=TEMPLATES)
    running = await start_service(path, fakes)
    running.parts.table.memory.replace_all(fleet(250))
    yield running
    await running.stop()


@pytest_twisted.ensureDeferred
async def test_leases_come_a_hundred_at_a_time_in_key_order_with_the_total(crossbar):
    first = await crossbar.get("/api/leases")
    assert len(first["leases"]) == 100 and first["total"] == 250 and first["next"]
    seen, cursor = [], None
    while True:
        page = await crossbar.get("/api/leases?limit=60" + (f"&cursor={cursor}" if cursor else ""))
        assert page["total"] == 250
        seen += [(x["route"], x["fp"], x["model"]) for x in page["leases"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == sorted(seen) and len(set(seen)) == 250
    assert [x["fp"] for x in first["leases"]] == [fp for _, fp, _ in seen[:100]]


@pytest_twisted.ensureDeferred
async def test_leases_filter_by_route_host_model_and_fingerprint_prefix(crossbar):
    one = await crossbar.get("/api/leases?route=team-3&limit=1000")
    assert {x["route"] for x in one["leases"]} == {"team-3"} and one["total"] == 21
    titan = await crossbar.get("/api/leases?host=titan&limit=1000")
    assert titan["total"] == 125 and {x["host"] for x in titan["leases"]} == {"titan"}
    assert (await crossbar.get("/api/leases?model=other"))["total"] == 0
    found = await crossbar.get("/api/leases?fp=fp00012")
    assert sorted(x["fp"] for x in found["leases"]) == [f"fp00012{d}" for d in range(10)]
    both = await crossbar.get("/api/leases?route=team-0&host=titan")
    assert both["total"] == 21 and both["next"] is None


@pytest_twisted.ensureDeferred
async def test_a_cursor_goes_on_after_its_key_while_leases_come_and_go(crossbar):
    page = await crossbar.get("/api/leases?limit=10")
    last = page["leases"][-1]
    table = crossbar.parts.table
    # The page's last lease goes; one comes before the cursor, one after.
    kept = [x for x in fleet(250) if x.key.fp != last["fp"]]
    new = [Lease(Key("team-0", fp, MODEL), "titan", State.ACTIVE, 2.0, 2.0) for fp in ("a", "z")]
    table.memory.replace_all(kept + new)
    rest = await crossbar.get(f"/api/leases?limit=1000&cursor={page['next']}")
    fps = [x["fp"] for x in rest["leases"]]
    assert fps[0] > last["fp"] and "z" in fps and "a" not in fps and len(fps) == 240 + 1
    assert rest["total"] == 251


@pytest_twisted.ensureDeferred
async def test_bad_limits_and_cursors_are_400s_that_say_which(crossbar):
    for query, words in [("limit=0", "limit:"), ("limit=1001", "limit:"),
                         ("cursor=nonsense", "cursor:"), ("cursor=WzFd", "cursor:"),
                         ("sort=size", "sort:")]:  # fmt: skip
        for path in ("/api/leases", "/api/routes"):
            if words == "sort:" and path == "/api/leases":
                continue
            code, body, _ = await crossbar.call("GET", f"{path}?{query}")
            assert code == 400 and body["error"]["message"].startswith(words), (path, query)


@pytest_twisted.ensureDeferred
async def test_routes_are_in_natural_order_searchable_sortable_and_paged(crossbar):
    await crossbar.chat("team-10", conversation("a"))
    await crossbar.chat("team-10", conversation("b"))
    await crossbar.chat("team-2", conversation("c"))
    answer = await crossbar.get("/api/routes?limit=5")
    names = [r["name"] for r in answer["routes"]]
    assert names == ["convo", "team-0", "team-1", "team-2", "team-3"]
    assert answer["total"] == 13 and answer["next"]
    rest = await crossbar.get(f"/api/routes?limit=1000&cursor={answer['next']}")
    assert [r["name"] for r in rest["routes"]][-3:] == ["team-9", "team-10", "team-11"]
    busiest = await crossbar.get("/api/routes?sort=requests&limit=2")
    assert [(r["name"], r["requests"]) for r in busiest["routes"]] == [
        ("team-10", 2),
        ("team-2", 1),
    ]
    search = await crossbar.get("/api/routes?route=m-1")
    assert [r["name"] for r in search["routes"]] == ["team-1", "team-10", "team-11"]
    most = (await crossbar.get("/api/routes?sort=leases&limit=1"))["routes"][0]
    assert (most["name"], most["leases"]) == ("team-2", 21 + 1)  # team-10 ties (20 + 2): by name
    assert sum(most["leases_by_host"].values()) == 22 and most["leases_by_host"]["titan"] >= 21
    assert [r["name"] for r in (await crossbar.get("/api/routes?host=atlas"))["routes"]] == (
        ["convo"] + [f"team-{i}" for i in range(12)]  # every route may use atlas
    )


class Turns(Clock):
    """A clock whose zero-delay calls run one reactor turn at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.due: list = []

    def callLater(self, delay, f, *args, **kw):
        call = super().callLater(delay, lambda: None)
        self.due.append((f, args, kw))
        return call

    def turn(self) -> None:
        f, args, kw = self.due.pop(0)
        f(*args, **kw)


def page_through(table, reactor, where, limit):
    """Every page of `where`, following the cursors; (keys seen, totals, reactor turns)."""
    keys, totals, turns, cursor = [], set(), 0, None
    while True:
        d = ensureDeferred(lease_page(table, reactor, where, cursor, limit))
        while not d.called:
            assert len(reactor.due) == 1  # the scan waits for the reactor's next turn
            turns += 1
            reactor.turn()
        page = d.result
        keys += [lease.key for lease in page.rows]
        totals.add(page.total)
        cursor = page.next
        if cursor is None:
            return keys, totals, turns


def test_a_fingerprint_search_scans_in_chunks_giving_the_reactor_back_between_them():
    table = empty_table()
    table.memory.replace_all(fleet(3 * CHUNK + 5))
    reactor = Turns()
    d = ensureDeferred(lease_page(table, reactor, LeaseFilter(fp="fp"), None, 10))
    turns = 0
    while not d.called:
        assert len(reactor.due) == 1
        turns += 1
        reactor.turn()
    assert turns == 3  # a turn of the reactor after each of the first three chunks
    assert d.result.total == 3 * CHUNK + 5 and len(d.result.rows) == 10


def test_a_page_reads_the_routes_it_shows_and_counts_the_rest_from_the_counters():
    table = empty_table()
    table.memory.replace_all(fleet(40 * CHUNK, routes=400))  # 100 leases a route
    reactor = Turns()
    for where in (LeaseFilter(), LeaseFilter(host="atlas"), LeaseFilter(model=MODEL)):
        d = ensureDeferred(lease_page(table, reactor, where, None, 100))
        assert d.called  # a route or three read: no chunk of the table, no turn given
        assert len(d.result.rows) == 100
        assert d.result.total == (40 * CHUNK if where.host is None else 20 * CHUNK)
    # One route of many leases is scanned in chunks like a search.
    table.memory.replace_all(fleet(3 * CHUNK + 5, routes=1))
    keys, totals, turns = page_through(table, reactor, LeaseFilter(host="titan"), 1000)
    assert totals == {(3 * CHUNK + 6) // 2} and turns >= 3
    assert keys == sorted(k.key for k in fleet(3 * CHUNK + 5, routes=1) if k.host == "titan")


def test_pages_give_every_matching_lease_once_in_key_order_whatever_the_filter():
    leases = fleet(2 * CHUNK + 17, routes=7) + [
        Lease(Key(f"team-{i % 3}", f"other{i:03d}", "m2"), "atlas", State.ACTIVE, 1.0, 1.0)
        for i in range(50)
    ]
    table = empty_table()
    table.memory.replace_all(leases)
    filters = [LeaseFilter(), LeaseFilter(host="titan"), LeaseFilter(model="m2"),
               LeaseFilter(route="team-2"), LeaseFilter(route="team-1", host="atlas"),
               LeaseFilter(route="team-0", model="m2", host="atlas"),
               LeaseFilter(fp="fp0001"), LeaseFilter(host="nowhere"),
               LeaseFilter(route="team-404")]  # fmt: skip
    for where in filters:
        want = sorted(x.key for x in leases if where.matches(x))
        for limit in (1, 7, 1000):
            keys, totals, _ = page_through(table, Turns(), where, limit)
            assert keys == want and totals == {len(want)}, (where, limit)


@pytest_twisted.ensureDeferred
async def test_top_tables_busiest_routes_worst_cache_hits_and_most_moved_conversations(crossbar):
    from crossbar.records import LeaseEvent, UsageRow

    store, now = crossbar.parts.store, crossbar.parts.clock.seconds()
    rows = [UsageRow(now - 60, route, "f", MODEL, "titan", "/v1/chat/completions", 200, False,
                     prompt_tokens=100, cached_tokens=cached)
            for route, n, cached in [("team-1", 3, 90), ("team-2", 1, 10), ("team-3", 2, 50)]
            for _ in range(n)]  # fmt: skip
    await store.record_usage_rows(rows)
    busiest = await crossbar.get("/api/usage?by=route&sort=requests&limit=2")
    assert [(u["route"], u["requests"]) for u in busiest["usage"]] == [("team-1", 3), ("team-3", 2)]
    worst = await crossbar.get("/api/usage?sort=cache_hit_ratio&limit=1")
    assert [(u["route"], u["cache_hit_ratio"]) for u in worst["usage"]] == [("team-2", 0.1)]
    code, body, _ = await crossbar.call("GET", "/api/usage?sort=size")
    assert code == 400 and body["error"]["message"].startswith("sort:")

    def moved(fp: str, at: float, reason: str = "unhealthy") -> LeaseEvent:
        return LeaseEvent(at, "team-1", fp, MODEL, "titan", "atlas", reason)

    await store.apply(events=[moved("x", now - 5), moved("x", now - 4), moved("y", now - 3),
                              LeaseEvent(now - 2, "team-1", "z", MODEL, "", "titan", "new"),
                              moved("old", now - 3 * 86400)])  # fmt: skip
    answer = await crossbar.get("/api/moves?limit=5")
    assert [(m["fp"], m["moves"]) for m in answer["moves"]] == [("x", 2), ("y", 1)]
    assert (await crossbar.get("/api/moves?since=7d"))["moves"][-1]["fp"] == "old"
