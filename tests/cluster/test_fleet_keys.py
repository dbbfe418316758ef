"""Named keys over several instances sharing a store (an SQLite file, and PostgreSQL): a key
made, blocked or rotated on one instance is known on the others within two seconds, and a
key's limits hold within 10% over all of them together."""

from __future__ import annotations

import json

import pytest_twisted
from twisted.internet.defer import DeferredList, ensureDeferred

from tests.support.admin_harness import Running
from tests.support.fleet import within
from tests.support.harness import MODEL, start_fakes, wait

DEV = "sk-fleet-dev-00112233"
ROUTES = {"team": {"hosts": ["titan"], "default_model": MODEL, "auth": "keys"}}


async def send(instance: Running, secret: str, n: int = 0) -> tuple[int, dict]:
    body = {
        "model": MODEL,
        "max_tokens": 20,
        # Longer than 64 characters: the guard learns tokens per character from such prompts,
        # so the estimates requests are admitted on come close to their cost.
        "messages": [
            {
                "role": "user",
                "content": f"Task {n:03d}: rename the module, then fix every import that refers to it.",
            }
        ],
    }
    response = await wait(
        instance.http().post(
            f"{instance.proxy_url}/r/team/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
        )
    )
    return response.code, json.loads(await wait(response.content()))


@pytest_twisted.ensureDeferred
async def test_a_key_blocked_on_one_instance_is_refused_by_the_other_within_two_seconds(
    tmp_path, shared_url, fleets
):
    keys = {"dev": {"secret": DEV, "routes": ["team"]}}
    fakes = await start_fakes("titan", tokens_per_second=2000)
    fleet = await fleets(tmp_path, shared_url, fakes, ROUTES, keys=keys)
    a, b = fleet.instances
    assert (await send(b, DEV))[0] == 200
    code, _, _ = await a.call("POST", "/api/keys/dev/block")
    assert code == 200
    assert (await send(a, DEV))[0] == 401  # at once where it was blocked
    await within(lambda: b.parts.tenants.book.get("dev").blocked, 2.0)
    assert (await send(b, DEV))[0] == 401
    # A key made on b works on a as soon as a has followed the change log.
    _, made, _ = await b.call("POST", "/api/keys", {"name": "ci", "routes": ["team"]})
    await within(lambda: "ci" in a.parts.tenants.book, 2.0)
    assert (await send(a, made["secret"]))[0] == 200
    # A rotation without grace voids the old secret on both.
    _, rotated, _ = await a.call("POST", "/api/keys/ci/rotate", {"grace": "0s"})
    await within(lambda: b.parts.tenants.book.identify(made["secret"], 0) is None, 2.0)
    assert (await send(b, made["secret"]))[0] == 401
    assert (await send(b, rotated["secret"]))[0] == 200


@pytest_twisted.ensureDeferred
async def test_a_daily_budget_holds_within_ten_percent_over_two_instances(
    tmp_path, shared_url, fleets
):
    budget = 3000
    keys = {"ci": {"secret": DEV, "routes": ["team"], "tokens_per_day": budget,
                   "cached_weight": 1.0}}  # fmt: skip
    fakes = await start_fakes("titan", tokens_per_second=5000)
    fleet = await fleets(tmp_path, shared_url, fakes, ROUTES, keys=keys, hosts=None)
    a, b = fleet.instances
    assert a.parts.tenants.meter.share.fraction() == 0.5
    spent, n = 0, 0
    for _ in range(12):
        # Ten requests on each instance at once, then both sync their spending with the store
        # (their `keys` timer does so every second; here in step, so the story is exact).
        sends = []
        for instance in (a, b):
            for _ in range(10):
                n += 1
                sends.append(ensureDeferred(send(instance, DEV, n)))
        for ok, (code, body) in await wait(DeferredList(sends), 60):
            assert ok and code in (200, 429), body
            if code == 200:
                spent += body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
        for instance in (a, b, a):
            await instance.parts.tenants.sync()
    assert 0.9 * budget <= spent <= 1.1 * budget, spent
    for instance in (a, b):
        used = instance.parts.tenants.show("ci")["used"]
        assert abs(used["tokens_today"] - spent) <= 0.1 * budget  # each sees the whole fleet's
