"""/metrics is Prometheus text that moves with real traffic through a real crossbar."""

import pytest_twisted
from attrs import evolve
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.task import Clock

from crossbar.admin.metrics import Metrics
from crossbar.config.values import parse_config
from crossbar.hosts.registry import Hosts
from crossbar.leases.journal import Journal
from crossbar.limiter.slots import Limiter
from crossbar.proxy.guard import ContextGuard
from crossbar.records import LeaseEvent, UsageRow
from tests.support.admin_harness import conversation, start_service, write_config
from tests.support.harness import MODEL, start_fakes, turn, until, wait
from tests.support.lease_fakes import FakeHosts, MemoryStore
from tests.support.routes import CONVO

ROUTES = CONVO


@pytest_twisted.async_yield_fixture
async def crossbar(tmp_path):
    fakes = await start_fakes("titan", "atlas")
    server = {"unhealthy_after": 1, "healthy_after": 1}
    path = write_config(tmp_path / "crossbar.toml", fakes, ROUTES, server=server)
    running = await start_service(path, fakes)
    yield running
    await running.stop()


async def scrape(crossbar) -> dict[str, float]:
    """Every sample of /metrics as {'name{label="v",...}': value}."""
    code, text, response = await crossbar.call("GET", "/metrics")
    assert code == 200
    assert response.headers.getRawHeaders("Content-Type")[0].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}"] = s.value
    return samples


def total(samples: dict[str, float], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        value
        for key, value in samples.items()
        if key.split("{", 1)[0] == name and all(w in key for w in wanted)
    )


@pytest_twisted.ensureDeferred
async def test_requests_tokens_timings_and_leases_move_with_traffic(crossbar):
    before = await scrape(crossbar)
    assert total(before, "crossbar_requests_total") == 0
    assert before['crossbar_host_healthy{host="titan"}'] == 1
    assert total(before, "crossbar_leases") == 0

    history = conversation("a")
    _, reply = await crossbar.chat("convo", history)
    await crossbar.chat("convo", turn(history, reply, "now the tests"))
    await crossbar.chat("convo", conversation("b"))

    after = await scrape(crossbar)
    assert total(after, "crossbar_requests_total", route="convo", status="200") == 3
    assert total(after, "crossbar_request_errors_total") == 0
    for kind in ("prompt", "cached", "completion"):
        assert total(after, "crossbar_tokens_total", route="convo", kind=kind) > 0, kind
    assert total(after, "crossbar_ttfb_seconds_count", route="convo") == 3
    assert total(after, "crossbar_queue_wait_seconds_count") == 3
    assert total(after, "crossbar_leases", model=MODEL) == 2
    assert after['crossbar_lease_events_total{reason="new"}'] == 2
    ratio = after['crossbar_cache_hit_ratio{route="convo"}']
    cached = total(after, "crossbar_tokens_total", route="convo", kind="cached")
    prompt = total(after, "crossbar_tokens_total", route="convo", kind="prompt")
    assert 0 < ratio == cached / prompt < 1
    assert after['crossbar_slots{host="titan",model="qwen-coder"}'] == 2


@pytest_twisted.ensureDeferred
async def test_pins_count_as_lease_moves_and_drains_and_health_show_per_host(crossbar):
    for name in ("a", "b"):
        await crossbar.chat("convo", conversation(name))
    await crossbar.call("PUT", "/api/routes/convo/pin", {"host": "atlas"})
    await crossbar.call("POST", "/api/hosts/titan/drain")
    crossbar.fakes["titan"].faults.loading = True  # /health answers 503
    await wait(crossbar.parts.hosts.probe_all())

    samples = await scrape(crossbar)
    assert samples['crossbar_lease_moves_total{reason="pin"}'] == 1  # titan's conversation
    assert samples['crossbar_lease_events_total{reason="pin"}'] == 2  # and the pin itself
    assert samples['crossbar_pins{host="atlas"}'] == 1
    assert samples['crossbar_host_draining{host="titan"}'] == 1
    assert samples['crossbar_host_healthy{host="titan"}'] == 0
    assert samples['crossbar_host_health_flips_total{host="titan"}'] == 1
    assert samples['crossbar_host_healthy{host="atlas"}'] == 1


@pytest_twisted.ensureDeferred
async def test_in_flight_is_read_from_the_limiter_while_a_request_runs(crossbar):
    for fake in crossbar.fakes.values():
        fake.config = evolve(fake.config, tokens_per_second=20)  # 16 tokens: most of a second
    running = ensureDeferred(crossbar.chat("convo", conversation("slow")))
    limiter = crossbar.parts.limiter

    def busy() -> int:
        return limiter.in_flight("titan", MODEL) + limiter.in_flight("atlas", MODEL)

    await until(busy)
    samples = await scrape(crossbar)
    assert total(samples, "crossbar_in_flight") == 1
    assert total(samples, "crossbar_queued") == 0
    await wait(running)
    assert total(await scrape(crossbar), "crossbar_in_flight") == 0


def test_labels_a_client_could_invent_are_folded_into_unknown():
    # A route name or a model no config serves must not become a new series per request.

    config = parse_config(
        {
            "hosts": {"titan": {"url": "http://127.0.0.1:9", "models": [MODEL]}},
            "routes": {"convo": {"hosts": ["titan"]}},
        }
    )
    hosts = Hosts(config, Clock(), get=lambda url, headers: Deferred())
    metrics = Metrics(config, None, hosts, None, None)  # type: ignore[arg-type]
    for model in ("gpt-9", "gpt-10"):
        metrics.observe(UsageRow(1.0, "convo", "", model, "", "/v1/chat/completions", 404, False))
    metrics.lease_event(LeaseEvent(1.0, "convo", "f", MODEL, "titan", "", "idle"))
    assert metrics.requests.labels("convo", "", "(unknown)", "404")._value.get() == 2
    assert metrics.request_errors.labels("convo", "", "(unknown)")._value.get() == 2
    assert metrics.lease_events.labels("idle")._value.get() == 1
    assert metrics.lease_moves.labels("idle")._value.get() == 0  # dropped, not moved


def test_the_counters_the_guard_the_limiter_and_the_prober_keep_are_exported():

    config = parse_config(
        {
            "hosts": {"titan": {"url": "http://127.0.0.1:9", "models": [MODEL], "parallel": 1}},
            "routes": {"convo": {"hosts": ["titan"]}},
        }
    )
    clock = Clock()
    limiter = Limiter(clock, lambda h, m: 1, queue_max=4, queue_timeout=60)
    first = []
    limiter.acquire("titan", MODEL).addCallback(first.append)
    waiting = limiter.acquire("titan", MODEL)
    leaving = limiter.acquire("titan", MODEL)
    leaving.addErrback(lambda _: None)
    leaving.cancel()  # its client went away
    clock.advance(3)
    first[0]()  # the waiter gets the slot after 3 s
    limiter.track("titan", MODEL)
    guard = ContextGuard(exact_counts=4, refused=2)

    class FixedHosts(FakeHosts):
        probe_errors = 7
        flips: dict = {}

        def parallel(self, host, model):
            return 1

        def models(self, host):
            return config.hosts[host].models

        def model(self, host, model):
            return config.hosts[host].model(model)

        def residency(self, host):
            return None  # no router-mode host

    class Table:
        journal = Journal(MemoryStore(), clock)

        def count(self, host, model):
            return 0

        def pins(self):
            return {}

    hosts = FixedHosts()
    hosts.held.add("titan")  # it flapped: held out of new placements
    metrics = Metrics(config, Table(), hosts, limiter, guard)  # type: ignore[arg-type]
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }
    pair = (("host", "titan"), ("model", MODEL))
    assert samples[("crossbar_guard_exact_counts_total", ())] == 4
    assert samples[("crossbar_guard_refused_total", ())] == 2
    assert samples[("crossbar_probe_errors_total", ())] == 7
    assert samples[("crossbar_host_held_down", (("host", "titan"),))] == 1
    assert samples[("crossbar_slots_admitted_total", pair)] == 2
    assert samples[("crossbar_queue_cancelled_total", pair)] == 1
    assert samples[("crossbar_queue_waited_seconds_total", pair)] == 3
    assert samples[("crossbar_tracked_total", pair)] == 1
    assert samples[("crossbar_store_degraded", ())] == 0
    assert waiting.called
