"""The prober against the fake llama-server: loading, refusing, coming back, discovering."""

import pytest_twisted
from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.web.client import Agent, HTTPConnectionPool

from crossbar.config.values import parse_config
from crossbar.hosts.registry import Hosts
from tests.support.harness import MODEL, start_fakes, wait


@pytest_twisted.ensureDeferred
async def test_the_prober_follows_a_fake_llama_server_down_and_back_up():
    fakes = await start_fakes("titan", parallel=3, ctx=2048)
    fake = fakes["titan"]
    config = parse_config(
        {
            "server": {"unhealthy_after": 2, "healthy_after": 2, "health_timeout": "1s"},
            "hosts": {"titan": {"url": fake.url, "models": [MODEL]}},
        }
    )
    pool = HTTPConnectionPool(reactor, persistent=False)
    hosts = Hosts(config, reactor, http=HTTPClient(Agent(reactor, pool=pool)))
    try:
        await wait(hosts.probe_all())
        assert hosts.healthy("titan")
        assert (hosts.parallel("titan", MODEL), hosts.ctx("titan", MODEL)) == (3, 2048)

        fake.faults.loading = True  # 503 "Loading model"
        for _ in range(2):
            await wait(hosts.probe_all())
        assert not hosts.healthy("titan")
        assert "Loading model" in hosts.status()[0]["reason"]

        fake.faults.loading = False
        await wait(hosts.probe_all())
        assert not hosts.healthy("titan")  # one good answer is not yet enough
        await wait(hosts.probe_all())
        assert hosts.healthy("titan")

        fake.faults.refuse = True
        await fake.settle()
        for _ in range(2):
            await wait(hosts.probe_all())
        assert not hosts.healthy("titan")
        assert "refused" in hosts.status()[0]["reason"]
        assert hosts.flips["titan"] == 3
    finally:
        await hosts.stop()
        await pool.closeCachedConnections()
        await fake.stop()
