"""Secrets (host api keys, client keys, the admin token) never appear in crossbar's logs."""

import json

import pytest_twisted
from twisted.logger import formatEvent, globalLogPublisher

from crossbar.config import hash_secret
from tests.support.admin_harness import start_service, write_config
from tests.support.harness import MODEL, host_table, start_fakes

HOST_KEY = "sk-host-0d1e2f"
CLIENT_KEY = "sk-client-9a8b7c"
ADMIN_TOKEN = "admin-5e6f7a8b"


@pytest_twisted.ensureDeferred
async def test_no_secret_reaches_the_log_whatever_happens(tmp_path):
    events = []
    globalLogPublisher.addObserver(events.append)
    fakes = await start_fakes("titan")
    path = write_config(
        tmp_path / "c.toml",
        fakes,
        {"convo": {"hosts": ["titan"], "keys": [CLIENT_KEY]}},
        server={"admin_token": ADMIN_TOKEN},
        hosts=host_table(fakes, api_key=HOST_KEY),
    )
    running = await start_service(path, fakes, token=ADMIN_TOKEN)
    try:
        messages = [{"role": "user", "content": "hello"}]
        host, _ = await running.chat("convo", messages, Authorization=f"Bearer {CLIENT_KEY}")
        assert host == "titan"
        wrong = await running.http().post(
            f"{running.proxy_url}/r/convo/v1/chat/completions",
            data=b'{"messages": []}',
            headers={"Authorization": f"Bearer {CLIENT_KEY}x"},
        )
        assert wrong.code == 401
        await wrong.content()
        assert (await running.call("GET", "/api/hosts"))[0] == 200
        assert (await running.call("GET", "/api/hosts", token=ADMIN_TOKEN + "x"))[0] == 401
        path.write_text(path.read_text() + "\n[routes.bad]\nhosts = []\n")
        assert (await running.call("POST", "/api/reload"))[0] == 400
        fakes["titan"].faults.refuse = True
        await fakes["titan"].settle()
        await running.http().post(
            f"{running.proxy_url}/r/convo/v1/chat/completions",
            data=b'{"model": "%s", "messages": [{"role": "user", "content": "x"}]}'
            % MODEL.encode(),
            headers={"Authorization": f"Bearer {CLIENT_KEY}"},
        )
        assert fakes["titan"].counters.requests["/v1/chat/completions"] == 1
    finally:
        await running.stop()
        globalLogPublisher.removeObserver(events.append)
    text = "\n".join(f"{formatEvent(e)} {e!r}" for e in events)
    assert len(events) > 5  # requests, reload refusal and the host failure were logged
    for secret in (HOST_KEY, CLIENT_KEY, ADMIN_TOKEN):
        assert secret not in text


NAMED = "sk-named-key-4c5d6e7f8a"


@pytest_twisted.ensureDeferred
async def test_no_named_key_secret_reaches_the_log_an_answer_or_the_metrics(tmp_path):
    events = []
    globalLogPublisher.addObserver(events.append)
    fakes = await start_fakes("titan")
    path = write_config(
        tmp_path / "c.toml",
        fakes,
        {"team": {"hosts": ["titan"], "auth": "keys"}},
        server={"metrics_keys": ["dev"]},
        keys={"dev": {"secret": NAMED, "routes": ["team"], "rpm": 2}},
    )
    running = await start_service(path, fakes)
    answers = []
    try:
        messages = [{"role": "user", "content": "hello"}]
        for _ in range(3):  # the third is over the key's rpm: 429, logged
            await running.http().post(
                f"{running.proxy_url}/r/team/v1/chat/completions",
                data=json.dumps({"model": MODEL, "messages": messages}).encode(),
                headers={"Authorization": f"Bearer {NAMED}"},
            )
        code, made, _ = await running.call("POST", "/api/keys", {"name": "ci", "routes": ["team"]})
        assert code == 201
        code, rotated, _ = await running.call("POST", "/api/keys/ci/rotate", {"grace": "1m"})
        created = [made["secret"], rotated["secret"]]
        for path_ in ("/api/keys", "/api/keys/dev", "/api/keys/ci", "/api/usage?by=key"):
            answers.append((await running.call("GET", path_))[1])
        answers.append((await running.call("GET", "/metrics"))[1])
        answers.append((await running.call("POST", "/api/keys/ci/block"))[1])
    finally:
        await running.stop()
        globalLogPublisher.removeObserver(events.append)
    text = "\n".join(f"{formatEvent(e)} {e!r}" for e in events)
    assert "over its rpm limit" in text  # the refusal was logged, once
    shown = json.dumps(answers)
    for secret in (NAMED, *created):
        assert secret not in text and secret not in shown
        assert hash_secret(secret) not in text and hash_secret(secret) not in shown
