"""An operator empties a host at once: its running answers move too (issue 50, "Evacuate now").

Three conversations live on titan and each streams a long answer there. `crossbar ctl evacuate
titan --now` moves their leases to atlas and stops the three streams: each goes on on atlas in
its client's stream, and each client reads one whole answer. A drain with a grace does the same
when the grace ends, and an undrain before then leaves the answers where they run.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from tests.cli.test_ctl import ctl
from tests.support.admin_harness import Running, conversation, start_service, write_config
from tests.support.harness import MODEL, host_table, start_fakes, until, wait
from tests.support.routes import CONVO

MAX_TOKENS = 60  # three seconds of answer at 20 tokens a second
NAMES = ("a", "b", "c")


async def three_on_titan(tmp_path: Any) -> Running:
    """crossbar over titan and atlas, with conversations a, b and c on titan."""
    fakes = await start_fakes("titan", "atlas", parallel=4)
    hosts = host_table(fakes, parallel=4)  # the three streams run at once on titan
    path = write_config(tmp_path / "c.toml", fakes, CONVO, hosts=hosts)
    crossbar = await start_service(path, fakes)
    await crossbar.call("POST", "/api/hosts/atlas/drain")
    for name in NAMES:
        host, _ = await crossbar.chat("convo", conversation(name))
        assert host == "titan"
    await crossbar.call("DELETE", "/api/hosts/atlas/drain")
    for fake in fakes.values():
        fake.config.tokens_per_second = 20  # the answers from here on take a while
    return crossbar


def stream(crossbar: Running, name: str) -> Deferred:
    """One conversation's streamed turn read by the official client, in a thread: (the chunks,
    the error it ended with or None)."""

    def run() -> tuple[list[Any], Exception | None]:
        client = openai.OpenAI(
            base_url=f"{crossbar.proxy_url}/r/convo/v1", api_key="x", max_retries=0
        )
        chunks: list[Any] = []
        try:
            for chunk in client.chat.completions.create(
                model=MODEL,
                messages=conversation(name),
                max_tokens=MAX_TOKENS,
                stream=True,
                stream_options={"include_usage": True},
            ):
                chunks.append(chunk)
        except openai.APIError as e:
            return chunks, e
        return chunks, None

    return deferToThread(run)


async def streaming_on_titan(crossbar: Running) -> list[Deferred]:
    """The three conversations' streams, once all three are under way on titan."""
    streams = [stream(crossbar, name) for name in NAMES]
    evacuator = crossbar.parts.handoff.evacuator
    await until(lambda: evacuator.streaming("titan") == len(NAMES))
    await deferLater(reactor, 0.2, lambda: None)  # a few tokens each reached its client
    return streams


async def whole_answers(crossbar: Running, streams: list[Deferred]) -> list[str]:
    """Each stream ended as one whole answer: the text each client read."""
    texts = []
    for name, d in zip(NAMES, streams, strict=True):
        chunks, error = await wait(d, 30)
        assert error is None, (name, error)
        assert len({c.id for c in chunks}) == 1  # one answer, not two glued together
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finishes[-1] == "length"
        assert chunks[-1].usage.completion_tokens == MAX_TOKENS  # both hosts' tokens
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        # The answer an uncut run gives: nothing lost or repeated where it moved.
        atlas = crossbar.fakes["atlas"]
        assert text == atlas.reply(conversation(name), max_tokens=MAX_TOKENS), name
        texts.append(text)
    return texts


def resumes(crossbar: Running) -> dict[tuple[str, str, str], int]:
    """crossbar_resumes_total's counts: (route, reason, outcome) -> n."""
    return dict(crossbar.parts.usage.resumes)


@pytest_twisted.ensureDeferred
async def test_evacuate_now_moves_three_running_answers_and_each_client_gets_one_whole(tmp_path):
    crossbar = await three_on_titan(tmp_path)
    try:
        streams = await streaming_on_titan(crossbar)
        code, out, err = await ctl(crossbar, "evacuate", "titan", "--now")
        assert code == 0, err
        assert out == (
            "host titan evacuated: 3 of 3 conversations moved (0 prewarmed), 3 running "
            "answers stopped and continued there; it holds no leases and can be stopped\n"
        )
        await whole_answers(crossbar, streams)
        assert crossbar.parts.table.count("titan", MODEL) == 0
        hosts = {h["name"]: h for h in (await crossbar.get("/api/hosts"))["hosts"]}
        evacuation = hosts["titan"]["evacuation"]
        assert (evacuation["now"], evacuation["stopped"], evacuation["left"]) == (True, 3, 0)
        assert resumes(crossbar) == {("convo", "evacuated", "resumed"): 3}
        metrics = (await crossbar.call("GET", "/metrics"))[1]
        line = 'crossbar_resumes_total{outcome="resumed",reason="evacuated",route="convo"} 3.0'
        assert line in metrics
        # Each conversation left titan once, to atlas, whichever step moved it (the
        # evacuation's move, or the continuation taking its lease along).
        events = (await crossbar.get("/api/events?route=convo"))["events"]
        left = [(e["from_host"], e["to_host"]) for e in events if e["from_host"] == "titan"]
        assert left == [("titan", "atlas")] * 3
        for name in NAMES:  # the next turns go to where the answers went on
            host, _ = await crossbar.chat("convo", conversation(name))
            assert host == "atlas"
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_an_evacuation_without_now_leaves_the_running_answers_to_end_on_the_host(tmp_path):
    crossbar = await three_on_titan(tmp_path)
    try:
        streams = await streaming_on_titan(crossbar)
        code, body, _ = await crossbar.call("POST", "/api/hosts/titan/evacuate")
        assert code == 200 and body["evacuation"]["stopped"] == 0
        for d in streams:
            chunks, error = await wait(d, 30)
            assert error is None
            assert chunks[-1].usage.completion_tokens == MAX_TOKENS
        assert resumes(crossbar) == {}
        assert [c.opening for c in crossbar.fakes["atlas"].counters.completions] == []
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_a_drain_with_a_grace_moves_the_answers_still_running_when_it_ends(tmp_path):
    crossbar = await three_on_titan(tmp_path)
    try:
        streams = await streaming_on_titan(crossbar)
        code, out, err = await ctl(crossbar, "drain", "titan", "--grace", "300ms")
        assert code == 0, err
        assert out == (
            "host titan is draining: it keeps its leases and gets no new ones; its running "
            "answers (3 now) move to other hosts in 300ms unless it is undrained before\n"
        )
        await whole_answers(crossbar, streams)
        assert resumes(crossbar) == {("convo", "drained", "resumed"): 3}
        assert crossbar.parts.table.count("titan", MODEL) == 0  # each lease went along
    finally:
        await crossbar.stop()


@pytest_twisted.ensureDeferred
async def test_an_undrain_before_the_grace_ends_moves_nothing(tmp_path):
    crossbar = await three_on_titan(tmp_path)
    try:
        streams = await streaming_on_titan(crossbar)
        code, body, _ = await crossbar.call("POST", "/api/hosts/titan/drain", {"grace": "500ms"})
        assert code == 200
        assert (body["grace"], body["stopped"], body["streaming"]) == (0.5, 0, 3)
        code, body, _ = await crossbar.call("DELETE", "/api/hosts/titan/drain")
        assert (code, body) == (200, {"host": "titan", "draining": False})
        await deferLater(reactor, 0.7, lambda: None)  # past the grace's end
        for d in streams:
            chunks, error = await wait(d, 30)
            assert error is None
            assert chunks[-1].usage.completion_tokens == MAX_TOKENS
        assert resumes(crossbar) == {}
        assert crossbar.parts.table.count("titan", MODEL) == 3
    finally:
        await crossbar.stop()
