"""crossbar in front of real llama.cpp llama-servers (skipped unless LLAMA_SERVER and
LLAMA_MODEL name the binary and a GGUF file; shared/tools/get-llama-server.sh builds both)."""

import json
import os
import signal
import subprocess

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from crossbar.demo.launch import free_ports
from tests.harness import MODEL, start_crossbar, wait

SERVER, GGUF = os.environ.get("LLAMA_SERVER", ""), os.environ.get("LLAMA_MODEL", "")
pytestmark = pytest.mark.skipif(
    not (os.path.isfile(SERVER) and os.path.isfile(GGUF)),
    reason="needs LLAMA_SERVER and LLAMA_MODEL (shared/tools/get-llama-server.sh)",
)
# 2 slots of 4096 tokens. --no-repack: this machine kind advertises AMX, which its VM does not
# enable, and the repacked weights run AMX kernels (SIGILL on the first request).
ARGS = ["-np", "2", "-c", "8192", "-t", "1", "--alias", MODEL, "--no-repack"]
SYSTEM = "You are a terse assistant. Answer in one short sentence."


class Llama:
    """One real llama-server process on a free port."""

    def __init__(self):
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [SERVER, "-m", GGUF, "--host", "127.0.0.1", "--port", str(self.port), *ARGS],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    async def ready(self, deadline: float = 60.0) -> None:
        for _ in range(int(deadline / 0.25)):
            try:
                response = await treq.get(self.url + "/health", timeout=1, persistent=False)
                await response.content()
                if response.code == 200:
                    return
            except Exception:
                pass
            await deferLater(reactor, 0.25, lambda: None)
        raise AssertionError(f"llama-server on {self.url} never became healthy")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)


@pytest_twisted.async_yield_fixture
async def fleet():
    llamas = {"titan": Llama(), "atlas": Llama()}
    try:
        for llama in llamas.values():
            await llama.ready()
        hosts = {name: {"url": llama.url, "models": [MODEL]} for name, llama in llamas.items()}
        crossbar = await start_crossbar(
            {}, {"convo": {"hosts": ["titan", "atlas"], "default_model": MODEL}}, hosts=hosts
        )
        await crossbar.parts.hosts.probe_all()  # discovery: parallel and ctx from /props
        yield crossbar, llamas
        await crossbar.stop()
    finally:
        for llama in llamas.values():
            llama.kill()


def openai_turns(base_url: str, opening: str, turns: int) -> list[dict]:
    """Drive one conversation with the official client, streaming; what each turn saw."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="none", max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": opening}]
    seen = []
    for n in range(turns):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,
            stream=True,
            max_tokens=16,
            temperature=0,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        for chunk in raw.parse():
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage:
                usage = chunk.usage
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        seen.append({"host": raw.headers["x-crossbar-host"], "text": text, "cached": cached})
        messages += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": f"And {n}?"},
        ]
    client.close()
    return seen


@pytest_twisted.ensureDeferred
async def test_real_conversations_stay_on_their_hosts_and_hit_the_real_prompt_cache(fleet):
    crossbar, _ = fleet
    assert crossbar.parts.hosts.ctx("titan", MODEL) == 4096  # discovered: 8192 over 2 slots
    base = crossbar.url("convo", "/v1")
    a = await wait(deferToThread(openai_turns, base, "Name a colour.", 3), 120)
    b = await wait(deferToThread(openai_turns, base, "Name a fruit.", 3), 120)
    assert len({t["host"] for t in a}) == 1 and len({t["host"] for t in b}) == 1
    assert a[0]["host"] != b[0]["host"]
    for turns in (a, b):
        assert all(t["text"] for t in turns)
        assert all(t["cached"] > 0 for t in turns[1:]), turns


@pytest_twisted.ensureDeferred
async def test_the_guard_counts_with_the_real_token_endpoint_and_refuses_before_prefill(fleet):
    crossbar, _ = fleet
    body = {
        "model": MODEL,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": " ".join(["word"] * 4500)}],
    }
    response = await wait(
        crossbar.client().post(
            crossbar.url("convo", "/v1/chat/completions"), data=json.dumps(body).encode()
        )
    )
    error = json.loads(await response.content())["error"]
    assert response.code == 400 and error["code"] == "context_length_exceeded"
    assert crossbar.parts.guard.exact_counts == 1  # the host's input_tokens endpoint decided
    assert "4096" in error["message"]


@pytest_twisted.ensureDeferred
async def test_a_killed_real_host_loses_its_conversation_to_the_other(fleet):
    crossbar, llamas = fleet
    messages = [{"role": "user", "content": "Remember the number seven."}]
    first, _ = await wait(crossbar.chat("convo", messages, max_tokens=8))
    home = first.headers.getRawHeaders("X-Crossbar-Host")[0]
    llamas[home].kill()
    second, reply = await wait(crossbar.chat("convo", messages, max_tokens=8), 60)
    assert second.code == 200, reply
    other = second.headers.getRawHeaders("X-Crossbar-Host")[0]
    assert other != home
    events = await crossbar.parts.store.list_events(route="convo")
    assert any(e.reason == "unhealthy" and e.from_host == home for e in events)
