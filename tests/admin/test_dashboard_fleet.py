"""The dashboard of a fleet: 100,000 conversations over 1,000 routes paint as fast as a few, and
a refresh fetches pages and top tables whose size does not grow with the lease count."""

import re
import time

import pytest
import pytest_twisted
from twisted.internet.threads import deferToThread

from crossbar.leases.table import Key, Lease, State
from tests.support.admin_harness import conversation, write_config
from tests.support.browser import CHROMIUM, element, render
from tests.support.harness import MODEL, start_fakes, wait

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed")
TEMPLATES = {"teams": {"match": "team-*", "hosts": ["titan", "atlas"], "default_model": MODEL}}


def fleet(n: int, routes: int = 1000) -> list[Lease]:
    return [
        Lease(Key(f"team-{i % routes}", f"{i:016x}", MODEL), ("titan", "atlas")[i % 2],
              State.ACTIVE, 1.0, 1.0)
        for i in range(n)
    ]  # fmt: skip


def page_facts(dom: str) -> tuple[int, int, int, int]:
    """(characters fetched by the last refresh, first paint ms, lease rows, route rows)."""
    fetched = int(re.search(r'data-fetched-bytes="(\d+)"', dom).group(1))
    paint = int(re.search(r'data-first-paint-ms="(\d+)"', dom).group(1))
    leases = element(dom, "leases").count("<tr data-lease=")
    routes = element(dom, "routes").count("<tr data-route=")
    return fetched, paint, leases, routes


@pytest_twisted.ensureDeferred
async def test_a_hundred_thousand_leases_paint_in_pages_and_refreshes_do_not_grow(tmp_path, serve):
    fakes = await start_fakes("titan", "atlas")
    path = write_config(tmp_path / "c.toml", fakes, {}, server={"admin_token": "t"},
                        templates=TEMPLATES)  # fmt: skip
    crossbar = await serve(path, fakes, token="t")
    await crossbar.chat("team-1", conversation("a"))
    url = f"{crossbar.admin_url}/#token=t"
    sizes = {}
    for n in (10_000, 100_000):
        crossbar.parts.table.memory.replace_all(fleet(n))
        started = time.monotonic()
        dom = await wait(deferToThread(render, url, tmp_path / f"profile{n}"), 120)
        wall = time.monotonic() - started
        assert element(dom, "errors") == ""
        fetched, paint, leases, routes = page_facts(dom)
        assert (leases, routes) == (50, 20)  # one page of each
        assert paint < 2000, paint
        assert f">{n:,}<" in element(dom, "totals")
        for top in ("usage", "worst"):  # the one route that served a request, in both
            assert element(dom, top).count("<tr data-route=") == 1, top
        sizes[n] = fetched
        print(f"{n} leases: {fetched} characters per refresh, painted at {paint} ms, "
              f"chromium ran {wall:.1f} s")  # fmt: skip
    # Ten times the leases: the same pages (a few more digits in the totals).
    assert abs(sizes[100_000] - sizes[10_000]) < 0.02 * sizes[10_000], sizes
