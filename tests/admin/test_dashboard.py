"""The dashboard in a real headless Chromium, rendering live data from a running crossbar."""

import re
from html import unescape

import openai
import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread

from crossbar.testing.fakerouter import FakeRouter
from crossbar.testing.fakestate import FakeConfig
from tests.support.admin_harness import conversation, start_service, write_config
from tests.support.batches import add_batch, batch_row, end_items, ended, submit
from tests.support.browser import CHROMIUM, element, render
from tests.support.harness import MODEL, start_fakes, turn, until, wait
from tests.support.routes import CONVO_AND_SOLO

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed")

ROUTES = CONVO_AND_SOLO


@pytest_twisted.async_yield_fixture
async def crossbar(tmp_path):
    fakes = await start_fakes("titan", "atlas")
    path = write_config(
        tmp_path / "crossbar.toml", fakes, ROUTES, server={"admin_token": "dash-token"}
    )
    running = await start_service(path, fakes, token="dash-token")
    yield running
    await running.stop()


@pytest_twisted.ensureDeferred
async def test_the_dashboard_shows_hosts_leases_events_usage_and_a_chart(crossbar, tmp_path):
    history = conversation("a")
    _, reply = await crossbar.chat("convo", history)
    await crossbar.chat("convo", turn(history, reply, "and the tests"))
    await crossbar.chat("solo", conversation("b"))
    await crossbar.call("POST", "/api/hosts/atlas/drain")
    url = f"{crossbar.admin_url}/#token=dash-token"

    dom = await wait(deferToThread(render, url, tmp_path / "profile"), 120)

    assert element(dom, "errors") == "", unescape(element(dom, "errors"))
    assert re.search(r'data-refreshes="\d+"', dom), "the page never finished a refresh"
    hosts = element(dom, "hosts")
    assert 'data-host="titan"' in hosts and 'data-host="atlas"' in hosts
    assert "healthy" in hosts and "draining" in hosts and ">undrain<" in hosts
    assert ">warm cache<" in hosts and " / ? tok, 0 evicted<" in hosts  # its cache truth
    # The pace columns: nothing waits, so 0 tokens queued and no wait; the rates titan's
    # answers taught (atlas, which served nothing, shows titan's, marked "~" as a guess).
    for head in ("queued prefill tokens", "expected wait", "prefill / decode tok/s", "by class"):
        assert f">{head}<" in hosts, head
    titan = re.search(r'<tr data-host="titan".*?</tr>', hosts, re.S).group(0)
    assert ">0.00 s<" in titan and 'title="rates: learned"' in titan
    assert 'title="batch may hold 1 of its slots">idle<' in titan  # 2 slots: all but one
    atlas = re.search(r'<tr data-host="atlas".*?</tr>', hosts, re.S).group(0)
    assert 'title="rates: model"' in atlas and ">~" in atlas
    leases = element(dom, "leases")
    assert leases.count("<tr data-lease=") == 2  # convo's conversation and solo's
    assert "convo" in leases and "solo" in leases
    events = element(dom, "events")
    assert events.count('data-reason="new"') == 2
    usage = element(dom, "usage")
    assert 'data-route="convo"' in usage and "%" in usage
    assert "cache hit" in element(dom, "cache-hit")
    chart = element(dom, "chart")
    assert chart.count("<polyline") == 2 and 'data-route="solo"' in chart
    assert ">release<" in element(dom, "routes")
    instances = element(dom, "instances")
    assert instances.count('data-alive="true"') == 1 and "(this one)" in instances
    assert "1 alive" in element(dom, "instance-count")

    shot = tmp_path / "dashboard.png"
    await wait(deferToThread(render, url, tmp_path / "profile2", shot), 120)
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:4] == b"\x89PNG"


@pytest_twisted.ensureDeferred
async def test_without_the_token_the_dashboard_reports_what_failed(crossbar, tmp_path):
    # No #token=: the page shows its token form and says what the API answered.
    dom = await wait(deferToThread(render, crossbar.admin_url + "/", tmp_path / "p"), 120)
    assert "401" in element(dom, "errors") and "admin_token" in unescape(element(dom, "errors"))
    assert re.search(r'<form id="login"\s*>', dom), "the token form is still hidden"
    assert "data-refreshes" not in dom


@pytest_twisted.ensureDeferred
async def test_the_dashboard_shows_each_routes_share_and_who_waits(crossbar, tmp_path):
    limiter, config = crossbar.parts.limiter, crossbar.service.config
    solo = config.route("solo").limits
    # Both of titan's slots held as solo requests would hold them; one real request waits.
    held = [await wait(limiter.acquire("titan", MODEL, solo)) for _ in range(2)]
    waiting = ensureDeferred(crossbar.chat("solo", conversation("w")))
    await until(lambda: limiter.queued("titan", MODEL) == 1)
    try:
        url = f"{crossbar.admin_url}/#token=dash-token"
        dom = await wait(deferToThread(render, url, tmp_path / "profile"), 120)
    finally:
        for release in held:
            release()
    await wait(waiting)

    assert element(dom, "errors") == "", unescape(element(dom, "errors"))
    hosts = element(dom, "hosts")
    assert "waiting (by route)" in hosts
    titan = re.search(r'<tr data-host="titan".*?</tr>', hosts, re.S).group(0)
    assert ">solo 1<" in titan
    cells = re.findall(r"<td[^>]*>(.*?)</td>", titan)
    # The waiter's prompt, and the wait a newcomer faces: the slots here are held by the test
    # without work, so only the waiter's own (fast on the fakes) counts.
    queued_prefill, expected = cells[9], cells[10]
    # Not a router-mode host: no models loaded count, no model state.
    assert (cells[3], cells[5]) == ("\u2013", "\u2013")
    assert int(queued_prefill.replace(",", "")) > 0
    assert re.fullmatch(r"\d+\.\d\d s", expected), expected
    routes = element(dom, "routes")
    for head in ("priority", "weight", "max in flight", "max queued", "in flight", "queued"):
        assert f">{head}<" in routes, head
    row = re.search(r'<tr data-route="solo".*?</tr>', routes, re.S).group(0)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
    # priority, weight, max in flight, max queued, in flight, queued
    assert cells[6:12] == ["0", "shared", "\u2013", "64", "2", "1"]  # an en dash: no cap
    assert ">standard 2 +1<" in cells[12]  # by class: two standard requests run, one waits


@pytest_twisted.ensureDeferred
async def test_the_dashboard_shows_an_evacuations_progress(crossbar, tmp_path):
    await crossbar.chat("convo", conversation("a"))
    await crossbar.chat("convo", conversation("b"))
    code, _, _ = await crossbar.call("POST", "/api/hosts/titan/evacuate")
    assert code == 200
    await crossbar.parts.handoff.evacuator.evacuations["titan"].done
    url = f"{crossbar.admin_url}/#token=dash-token"
    dom = await wait(deferToThread(render, url, tmp_path / "profile"), 120)
    hosts = element(dom, "hosts")
    assert 'data-evacuation="done"' in hosts and "<progress" in hosts
    assert "evacuated 1/1" in hosts
    assert ">evacuate<" in hosts  # atlas may be evacuated next


@pytest_twisted.ensureDeferred
async def test_a_router_mode_hosts_models_loaded_and_their_states_are_shown(tmp_path):
    router = FakeRouter(reactor, {"coder": FakeConfig(), "chat": FakeConfig()},
                        loaded=("coder",), models_max=1)  # fmt: skip
    await router.start()
    hosts = {"gpu1": {"url": router.url, "models": "discover"}}
    path = write_config(tmp_path / "crossbar.toml", {}, {"convo": {"hosts": ["gpu1"]}},
                        server={"admin_token": "dash-token"}, hosts=hosts)  # fmt: skip
    running = await start_service(path, {}, token="dash-token")
    try:
        url = f"{running.admin_url}/#token=dash-token"
        dom = await wait(deferToThread(render, url, tmp_path / "profile"), 120)
        assert element(dom, "errors") == "", unescape(element(dom, "errors"))
        table = element(dom, "hosts")
        assert ">models loaded<" in table and ">state<" in table
        pattern = r'<tr data-host="gpu1" data-model="(\w+)".*?>(.*?)</tr>'
        found = re.findall(pattern, table, re.S)
        rows = {m: re.findall(r"<td[^>]*>(.*?)</td>", row) for m, row in found}
        assert "1 of 1" in rows["coder"][3]  # one model running of the one it holds
        assert ">loaded<" in rows["coder"][5] and ">unloaded<" in rows["chat"][5]
    finally:
        await running.stop()
        await router.stop()


@pytest_twisted.ensureDeferred
async def test_the_dashboard_shows_each_batchs_progress_tokens_and_eta(crossbar, tmp_path):
    store = crossbar.parts.store
    oai = openai.OpenAI(base_url=f"{crossbar.proxy_url}/r/convo/v1", api_key="-", max_retries=0)
    done = await ended(store, await submit(oai, 3))  # run by the service's own runner
    crossbar.parts.batches.halt()  # from here on the batches stay as the story makes them
    now = reactor.seconds()
    await add_batch(store, batch_row("batch_waiting", "convo", "", created=now, total=6))
    # Half of this one ended in its first 100 seconds (one answered, one failed): the rest
    # should take as long again.
    await add_batch(store, batch_row("batch_half", "solo", "alice", created=now - 100, total=4))
    await end_items(store, "batch_half", done=1, failed=1, now=now, tokens=(1500, 0, 25))

    url = f"{crossbar.admin_url}/#token=dash-token"
    dom = await wait(deferToThread(render, url, tmp_path / "profile"), 120)

    assert element(dom, "errors") == "", unescape(element(dom, "errors"))
    table = element(dom, "batches")
    for head in ("batch", "route", "key", "status", "progress", "tokens in / out", "ETA"):
        assert f">{head}<" in table, head

    def cells(batch_id: str) -> list[str]:
        row = re.search(rf'<tr data-batch="{batch_id}" data-status="(\w+)".*?</tr>', table, re.S)
        assert row, batch_id
        return [row.group(1), *re.findall(r"<td[^>]*>(.*?)</td>", row.group(0), re.S)]

    status, _, route, key, shown, progress, tokens, eta, _, button = cells(done.id)
    assert (status, route, key) == ("completed", "convo", "\u2013")  # no named key
    assert shown == '<span class="ok">completed</span>'
    assert progress.endswith(" 3/3</span>") and "failed" not in progress
    assert tokens == f"{done.counts.prompt_tokens:,} / {done.counts.completion_tokens:,}"
    assert (eta, button) == ("\u2013", "")  # ended: no ETA, nothing to cancel
    status, _, route, _, _, progress, tokens, eta, _, button = cells("batch_waiting")
    assert (status, route, tokens) == ("in_progress", "convo", "0 / 0")
    assert progress.endswith(" 0/6</span>")
    assert eta == "\u2013" and ">cancel<" in button  # nothing ended yet: no pace to go by
    status, _, route, key, _, progress, tokens, eta, _, button = cells("batch_half")
    assert (status, route, key, tokens) == ("in_progress", "solo", "alice", "1,500 / 25")
    assert ' 2/4<span class="bad">, 1 failed</span>' in progress
    assert re.fullmatch(r'<span title="at the pace so far">2m</span>', eta), eta
