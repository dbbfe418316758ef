"""What the admin API and /metrics show of routes sharing the queues: each route's limits, in
flight and queued; waiters per route on each host; queue metrics by route, templates folded."""

import pytest_twisted
from twisted.internet.defer import ensureDeferred

from crossbar.admin.metrics import UNKNOWN, route_label
from crossbar.config.values import parse_config
from tests.admin.test_metrics import scrape
from tests.cli.test_ctl import ctl
from tests.support.admin_harness import conversation, start_service, write_config
from tests.support.harness import MODEL, host_table, start_fakes, until, wait

ROUTES = {
    "batch": {"hosts": ["titan"], "default_model": MODEL, "weight": 2, "max_in_flight": 1,
              "max_queued": 5},
    "agent": {"hosts": ["titan"], "default_model": MODEL, "priority": 1},
    "ide": {"hosts": ["titan"], "default_model": MODEL, "queue": False},
}  # fmt: skip
TEMPLATES = {"projects": {"match": "proj-*", "hosts": ["titan"], "default_model": MODEL,
                          "priority": -1}}  # fmt: skip


@pytest_twisted.async_yield_fixture
async def crossbar(tmp_path):
    fakes = await start_fakes("titan")
    path = write_config(
        tmp_path / "crossbar.toml",
        fakes,
        ROUTES,
        templates=TEMPLATES,
        hosts=host_table(fakes, parallel=1),
    )
    running = await start_service(path, fakes)
    yield running
    await running.stop()


async def batch_holds_the_slot_and_two_wait(crossbar):
    """The only slot held as a batch request would hold it (its release returned), and a batch
    and a project request waiting behind it (their Deferreds)."""
    limiter, config = crossbar.parts.limiter, crossbar.service.config
    release = await wait(limiter.acquire("titan", MODEL, config.route("batch").limits))
    batch = ensureDeferred(crossbar.chat("batch", conversation("b")))
    project = ensureDeferred(crossbar.chat("proj-alpha", conversation("p")))
    await until(lambda: limiter.queued("titan", MODEL) == 2)
    return release, batch, project


@pytest_twisted.ensureDeferred
async def test_routes_hosts_and_metrics_show_each_routes_share_while_it_waits(crossbar):
    release, batch, project = await batch_holds_the_slot_and_two_wait(crossbar)

    routes = {r["name"]: r for r in (await crossbar.get("/api/routes"))["routes"]}
    keys = ("priority", "weight", "max_in_flight", "max_queued", "in_flight", "queued")

    def share(name):
        return tuple(routes[name][k] for k in keys)

    assert share("batch") == (0, 2.0, 1, 5, 1, 1)
    assert share("agent") == (1, None, None, 64, 0, 0)
    assert share("ide") == (0, None, None, None, 0, 0)
    assert share("proj-alpha") == (-1, None, None, 64, 0, 1)  # seen: it waits in the queue
    assert routes["proj-alpha"]["template"] == "projects"
    # Per request class, by the class each request runs at (all standard here).
    assert routes["batch"]["classes"]["standard"] == {"in_flight": 1, "queued": 1}
    assert routes["batch"]["classes"]["batch"] == {"in_flight": 0, "queued": 0}
    assert routes["batch"]["class"] == "standard" and routes["batch"]["batch_slots"] is None

    (titan,) = (await crossbar.get("/api/hosts"))["hosts"]
    (model,) = titan["models"]
    assert model["queued"] == 2
    assert model["queued_by_route"] == {"batch": 1, "proj-alpha": 1}

    samples = await scrape(crossbar)
    queued = {key: value for key, value in samples.items() if key.startswith("crossbar_queued{")}
    pair = f'host="titan",model="{MODEL}"'
    assert queued == {
        f'crossbar_queued{{{pair},route="agent"}}': 0,
        f'crossbar_queued{{{pair},route="batch"}}': 1,
        f'crossbar_queued{{{pair},route="template:projects"}}': 1,
    }

    release()  # batch is below its cap again; it outranks the project route's priority -1
    await wait(batch)
    await wait(project)
    samples = await scrape(crossbar)
    waits = {
        key: value
        for key, value in samples.items()
        if key.startswith("crossbar_queue_wait_seconds_count")
    }
    assert waits == {
        f'crossbar_queue_wait_seconds_count{{{pair},route="batch"}}': 1,
        f'crossbar_queue_wait_seconds_count{{{pair},route="template:projects"}}': 1,
    }
    assert not any("proj-alpha" in key for key in samples if "queue" in key)


@pytest_twisted.ensureDeferred
async def test_ctl_routes_and_hosts_show_the_shares_and_who_waits(crossbar):
    release, batch, project = await batch_holds_the_slot_and_two_wait(crossbar)
    code, out, err = await ctl(crossbar, "routes")
    assert (code, err) == (0, "")
    header, *lines = out.splitlines()
    assert header.split()[6:] == [
        "PRIORITY", "WEIGHT", "MAX_IN_FLIGHT", "MAX_QUEUED", "IN_FLIGHT", "QUEUED",
    ]  # fmt: skip
    rows = {line.split()[0]: line.split()[-6:] for line in lines}
    assert rows["batch"] == ["0", "2", "1", "5", "1", "1"]
    assert rows["agent"] == ["1", "shared", "-", "64", "0", "0"]
    assert rows["proj-alpha"] == ["-1", "shared", "-", "64", "0", "1"]
    code, out, _ = await ctl(crossbar, "hosts")
    header, line = out.splitlines()
    assert line.split()[header.split().index("WAITING")] == "batch=1,proj-alpha=1"
    release()
    await wait(batch)
    await wait(project)


def test_queue_metrics_label_routes_by_name_and_fold_template_routes_and_strangers():
    config = parse_config(
        {
            "hosts": {"titan": {"url": "http://127.0.0.1:9", "models": [MODEL]}},
            "routes": {"batch": {"hosts": ["titan"]}, "proj-x": {"hosts": ["titan"]}},
            "templates": {"projects": {"match": "proj-*", "hosts": ["titan"]}},
        }
    )
    assert route_label(config, "batch") == "batch"
    assert route_label(config, "proj-x") == "proj-x"  # a concrete route wins over a template
    assert route_label(config, "proj-alpha") == "template:projects"
    assert route_label(config, "scanner") == UNKNOWN
    assert route_label(config, "") == UNKNOWN


@pytest_twisted.ensureDeferred
async def test_a_reload_places_waiting_requests_by_their_routes_new_priority(crossbar):
    rows = []
    crossbar.parts.usage.observers.append(rows.append)
    release, batch, project = await batch_holds_the_slot_and_two_wait(crossbar)
    agent = ensureDeferred(crossbar.chat("agent", conversation("a")))
    limiter = crossbar.parts.limiter
    await until(lambda: limiter.queued("titan", MODEL) == 3)
    # Before the reload the order would be agent (1), batch (0), the project route (-1).
    raised = {"projects": {**TEMPLATES["projects"], "priority": 2}}
    write_config(
        crossbar.path,
        crossbar.fakes,
        ROUTES,
        templates=raised,
        hosts=host_table(crossbar.fakes, parallel=1),
    )
    code, body, _ = await crossbar.call("POST", "/api/reload")
    assert code == 200, body
    routes = {r["name"]: r for r in (await crossbar.get("/api/routes"))["routes"]}
    assert routes["proj-alpha"]["priority"] == 2 and routes["proj-alpha"]["queued"] == 1

    release()
    for d in (batch, project, agent):
        await wait(d)
    assert [row.route for row in rows] == ["proj-alpha", "agent", "batch"]
