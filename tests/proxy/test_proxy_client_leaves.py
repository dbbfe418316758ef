"""A client that hangs up before its host answered is not the host's fault.

The Agent reports a cancelled request as ResponseNeverReceived([CancelledError]); taken for a
reset, it would mark the host unhealthy, move its leases and resend the request to another host
with nobody waiting for it.
"""

import json

import pytest_twisted

from tests.support.harness import MODEL, start_crossbar, start_fakes, until, wait
from tests.support.routes import CONVO

ROUTES = CONVO


@pytest_twisted.ensureDeferred
async def test_a_client_leaving_before_the_host_answers_leaves_the_host_healthy():
    fakes = await start_fakes("titan", "atlas")
    crossbar = await start_crossbar(fakes, ROUTES)
    for fake in fakes.values():
        fake.faults.hang = True  # accept the request, never answer
    limiter = crossbar.parts.limiter
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "a long prefill"}]}
        request = crossbar.client().post(
            crossbar.url("convo", "/v1/chat/completions"), data=json.dumps(body).encode()
        )
        await until(lambda: limiter.in_flight("titan", MODEL) == 1)
        request.cancel()
        request.addErrback(lambda _: None)
        await until(lambda: limiter.in_flight("titan", MODEL) == 0)
        await wait(crossbar.parts.hosts.probe_all())  # one good probe would not heal it yet
        assert crossbar.parts.hosts.healthy("titan")
        assert limiter.in_flight("atlas", MODEL) == 0  # not retried for nobody
        assert fakes["atlas"].counters.requests["/v1/chat/completions"] == 0
    finally:
        for fake in fakes.values():  # end whatever still hangs while the store is open
            await fake.stop()
        await until(
            lambda: not limiter.in_flight("titan", MODEL) + limiter.in_flight("atlas", MODEL)
        )
        await crossbar.stop()
