"""The operator's keys through the admin API and `crossbar ctl keys`: a new key's secret is shown
once and works at once; a block refuses it at once; a rotation keeps the old secret for its
grace only; a list or a show never holds a secret; usage and metrics name keys, never secrets."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import pytest_twisted
from twisted.internet.threads import deferToThread

from crossbar.cli.main import main
from tests.support.admin_harness import Running, start_service, write_config
from tests.support.harness import MODEL, start_fakes, wait

DEV = "sk-config-dev-0011223344"
ROUTES = {
    "team": {"hosts": ["titan"], "default_model": MODEL, "auth": "keys"},
    "open": {"hosts": ["titan"], "default_model": MODEL},
}
KEYS = {"dev": {"secret": DEV, "routes": ["team"], "tpm": 100000}}
HELLO = [{"role": "user", "content": "hello"}]


async def start(tmp_path, db: str = ":memory:", keys: dict | None = None) -> Running:
    fakes = await start_fakes("titan")
    path = write_config(
        tmp_path / "c.toml",
        fakes,
        ROUTES,
        server={"db": db, "metrics_keys": ["dev"]},
        keys=KEYS if keys is None else keys,
    )
    return await start_service(path, fakes)


@pytest_twisted.async_yield_fixture
async def crossbar(tmp_path):
    running = await start(tmp_path)
    yield running
    await running.stop()


async def status_of(crossbar: Running, secret: str, route: str = "team") -> int:
    response = await wait(
        crossbar.http().post(
            f"{crossbar.proxy_url}/r/{route}/v1/chat/completions",
            data=json.dumps({"model": MODEL, "messages": HELLO}).encode(),
            headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
        )
    )
    await wait(response.content())
    return response.code


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


async def ctl(crossbar: Running, *argv: str) -> tuple[int, str, str]:
    return await wait(deferToThread(_run, ["ctl", "--admin", crossbar.admin_url, *argv]), 30)


def no_secret_in(answer: Any, *secrets: str) -> None:
    text = json.dumps(answer)
    for secret in secrets:
        assert secret not in text


@pytest_twisted.ensureDeferred
async def test_a_new_key_is_201_with_its_secret_once_and_works_at_once(crossbar):
    code, made, _ = await crossbar.call(
        "POST", "/api/keys", {"name": "ci", "routes": ["team"], "tokens_per_day": 50000}
    )
    assert code == 201, made
    secret = made["secret"]
    assert secret.startswith("cb-") and made["name"] == "ci" and made["source"] == "api"
    assert made["limits"]["tokens_per_day"] == 50000
    assert await status_of(crossbar, secret) == 200
    listed = await crossbar.get("/api/keys")
    assert [k["name"] for k in listed["keys"]] == ["ci", "dev"]
    shown = await crossbar.get("/api/keys/ci")
    assert shown["used"]["requests"] == 1 and shown["used"]["tokens_today"] > 0
    assert "secret" not in shown and "sha256" not in json.dumps(shown)
    no_secret_in([listed, shown], secret, DEV)
    code, body, _ = await crossbar.call("POST", "/api/keys", {"name": "ci", "routes": ["team"]})
    assert code == 409 and "exists" in body["error"]["message"]


@pytest_twisted.ensureDeferred
async def test_a_bad_new_key_is_400_naming_every_field(crossbar):
    code, body, _ = await crossbar.call("POST", "/api/keys", {"name": "Bad Name", "tpm": -1})
    assert code == 400
    message = body["error"]["message"]
    assert "name: bad key name" in message and "routes: missing" in message
    assert "tpm: must be at least 1, not -1" in message


@pytest_twisted.ensureDeferred
async def test_a_blocked_key_is_refused_at_once_and_an_unblocked_one_served_again(crossbar):
    assert await status_of(crossbar, DEV) == 200
    code, body, _ = await crossbar.call("POST", "/api/keys/dev/block")
    assert (code, body) == (200, {"key": "dev", "blocked": True})
    assert await status_of(crossbar, DEV) == 401
    assert await status_of(crossbar, DEV, route="open") == 401
    await crossbar.call("DELETE", "/api/keys/dev/block")
    assert await status_of(crossbar, DEV) == 200


@pytest_twisted.ensureDeferred
async def test_a_rotation_keeps_the_old_secret_for_its_grace_and_no_longer(crossbar):
    code, rotated, _ = await crossbar.call("POST", "/api/keys/dev/rotate", {"grace": "1h"})
    assert code == 200 and rotated["grace"] == 3600
    new = rotated["secret"]
    assert await status_of(crossbar, new) == 200
    assert await status_of(crossbar, DEV) == 200  # within its grace
    shown = await crossbar.get("/api/keys/dev")
    assert shown["previous_secret_valid_until"] > crossbar.parts.clock.seconds() + 3500
    no_secret_in(shown, new, DEV)
    code, again, _ = await crossbar.call("POST", "/api/keys/dev/rotate", {"grace": "0s"})
    assert await status_of(crossbar, again["secret"]) == 200
    assert await status_of(crossbar, new) == 401  # no grace: void at once
    assert await status_of(crossbar, DEV) == 401
    code, body, _ = await crossbar.call("POST", "/api/keys/dev/rotate", {"grace": "soon"})
    assert code == 400 and body["error"]["message"].startswith("grace:")


@pytest_twisted.ensureDeferred
async def test_delete_removes_an_api_key_and_refuses_a_config_one(crossbar):
    _, made, _ = await crossbar.call("POST", "/api/keys", {"name": "tmp", "routes": ["team"]})
    code, body, _ = await crossbar.call("DELETE", "/api/keys/tmp")
    assert (code, body) == (200, {"key": "tmp", "deleted": True})
    assert await status_of(crossbar, made["secret"]) == 401
    code, body, _ = await crossbar.call("DELETE", "/api/keys/dev")
    assert code == 409 and "[keys.dev]" in body["error"]["message"]
    code, body, _ = await crossbar.call("GET", "/api/keys/nobody")
    assert code == 404 and body["error"]["message"] == "no key named 'nobody'"


@pytest_twisted.ensureDeferred
async def test_a_restart_with_the_same_config_keeps_a_block_and_a_changed_entry_reseeds(tmp_path):
    db = str(tmp_path / "crossbar.db")
    first = await start(tmp_path, db)
    try:
        await first.call("POST", "/api/keys/dev/block")
        _, made, _ = await first.call("POST", "/api/keys", {"name": "ci", "routes": ["team"]})
    finally:
        await first.stop()
    second = await start(tmp_path, db)
    try:
        assert await status_of(second, DEV) == 401  # the operator's block stays
        assert await status_of(second, made["secret"]) == 200  # the API's key stays
    finally:
        await second.stop()
    changed = {"dev": {**KEYS["dev"], "tpm": 5000}}  # the operator edited the entry
    third = await start(tmp_path, db, keys=changed)
    try:
        assert await status_of(third, DEV) == 200  # the config says what the key is again
        assert (await third.get("/api/keys/dev"))["limits"]["tpm"] == 5000
    finally:
        await third.stop()
    gone = await start(tmp_path, db, keys={})
    try:
        assert await status_of(gone, DEV) == 401  # a config key the config dropped
        assert [k["name"] for k in (await gone.get("/api/keys"))["keys"]] == ["ci"]
    finally:
        await gone.stop()


@pytest_twisted.ensureDeferred
async def test_usage_by_key_and_metrics_name_keys_only_as_the_operator_lists_them(crossbar):
    _, made, _ = await crossbar.call("POST", "/api/keys", {"name": "ci", "routes": ["team"]})
    for secret in (DEV, DEV, made["secret"]):
        assert await status_of(crossbar, secret) == 200
    usage = await crossbar.get("/api/usage?by=key")
    assert [(u["key"], u["requests"]) for u in usage["usage"]] == [("ci", 1), ("dev", 2)]
    code, metrics, _ = await crossbar.call("GET", "/metrics")
    assert code == 200
    assert 'crossbar_key_requests_total{key="dev"} 2.0' in metrics
    assert 'crossbar_key_requests_total{key="(other)"} 1.0' in metrics  # ci is not listed
    assert 'key="ci"' not in metrics
    no_secret_in(metrics, DEV, made["secret"])


@pytest_twisted.ensureDeferred
async def test_ctl_keys_creates_lists_shows_blocks_rotates_and_deletes(crossbar):
    code, out, err = await ctl(
        crossbar, "keys", "create", "ci", "--route", "team", "--tokens-per-day", "1000"
    )
    assert (code, err) == (0, "")
    secret = out.strip().splitlines()[-1]
    assert secret.startswith("cb-") and await status_of(crossbar, secret) == 200
    code, out, _ = await ctl(crossbar, "keys", "list")
    assert code == 0 and "ci" in out and "tokens_per_day=1000" in out and secret not in out
    code, out, _ = await ctl(crossbar, "keys", "show", "ci")
    assert code == 0 and "tokens this minute" in out and secret not in out
    code, out, _ = await ctl(crossbar, "keys", "block", "ci")
    assert code == 0 and await status_of(crossbar, secret) == 401
    await ctl(crossbar, "keys", "unblock", "ci")
    code, out, _ = await ctl(crossbar, "keys", "rotate", "ci", "--grace", "10m")
    new = out.strip().splitlines()[-1]
    assert code == 0 and new != secret and await status_of(crossbar, new) == 200
    assert await status_of(crossbar, secret) == 200  # its grace
    code, out, _ = await ctl(crossbar, "keys", "delete", "ci")
    assert code == 0 and await status_of(crossbar, new) == 401
    code, out, err = await ctl(crossbar, "keys", "delete", "dev")
    assert code == 1 and "[keys.dev]" in err
    code, out, _ = await ctl(crossbar, "usage", "--by", "key")
    assert code == 0 and out.startswith("KEY")
