"""The valve as the official clients meet it, on real sockets: two fake llama-servers with one
slot each writing 20 tokens a second, four conversations spread over them, then two on one
host at once. The second waits a whole reply at home or re-prefills a short history on the
idle host: it moves, says so, and stays."""

import pytest_twisted
from twisted.internet import defer
from twisted.internet.threads import deferToThread

from tests.support.harness import MODEL, start_fakes, wait

PACE = {"parallel": 1, "tokens_per_second": 20, "prefill_ms_per_token": 2, "reply_tokens": 20}


@pytest_twisted.ensureDeferred
async def test_the_openai_client_sees_its_busy_conversation_moved_and_kept(launch):
    from openai import OpenAI

    fakes = await start_fakes("titan", "atlas", **PACE)
    crossbar = await launch(fakes, {"convo": {"hosts": ["titan", "atlas"]}}, parallel=1)
    histories = [
        [{"role": "user", "content": f"Conversation {i}: fix the flaky test in module {i}."}]
        for i in range(4)
    ]

    def one_turn(i: int) -> tuple[str, str]:
        client = OpenAI(base_url=crossbar.url("convo", "/v1"), api_key="none", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=histories[i])
        reply = raw.parse().choices[0].message.content
        histories[i] = [*histories[i], {"role": "assistant", "content": reply}]
        histories[i].append({"role": "user", "content": "And then?"})
        client.close()
        return raw.headers["X-Crossbar-Host"], raw.headers["X-Crossbar-Lease"]

    homes = [(await wait(deferToThread(one_turn, i), 30))[0] for i in range(4)]
    assert homes == ["titan", "atlas", "titan", "atlas"]
    a, b = await wait(
        defer.gatherResults([deferToThread(one_turn, 0), deferToThread(one_turn, 2)]), 30
    )
    assert sorted([a, b]) == [("atlas", "moved"), ("titan", "reused")]
    mover = 0 if a == ("atlas", "moved") else 2
    assert await wait(deferToThread(one_turn, mover), 30) == ("atlas", "reused")
    events = await crossbar.parts.store.list_events()
    assert [(e.reason, e.from_host, e.to_host) for e in events if e.reason == "busy"] == [
        ("busy", "titan", "atlas")
    ]
    # The dashboard's "Most moved conversations" counts it.
    (moved,) = await crossbar.parts.store.top_moves(0, 10)
    assert moved["moves"] == 1 and moved["route"] == "convo"
