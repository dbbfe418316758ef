"""Real llama-servers failing under crossbar: a host killed mid-conversation, a client that
leaves in the middle of a long stream."""

import pytest_twisted
from twisted.internet.threads import deferToThread

from tests.real.dialogue import OpenAIChat, openai_client, read_from_cache
from tests.support.harness import MODEL, until

LONG = 2000  # reply tokens: about a minute of generation on this machine's one thread


@pytest_twisted.ensureDeferred
async def test_a_killed_host_hands_its_conversation_to_the_survivor_which_then_caches_it(launch):
    crossbar, fleet = await launch()
    doomed = OpenAIChat(crossbar, "Let us talk about colours.", stream=False)
    other = OpenAIChat(crossbar, "Let us talk about fruit.", stream=False)
    first = await fleet.within(doomed.say("Name one."), 60, "the first conversation's turn")
    kept = await fleet.within(other.say("Name one."), 60, "the second conversation's turn")
    home, survivor = first.host, kept.host
    assert home != survivor

    fleet.llamas[home].kill()  # SIGKILL: the host's cache is gone with it
    moved = await fleet.within(doomed.say("Another?"), 60, "the turn after the kill")
    again = await fleet.within(doomed.say("And a third?"), 60, "the turn on the new host")
    stayed = await fleet.within(other.say("Another?"), 60, "the other conversation's turn")

    assert moved.host == again.host == stayed.host == survivor  # the other one never moved
    assert not read_from_cache(first, moved)  # its cache died with its host
    assert read_from_cache(moved, again)  # warm again on the survivor from the next turn on
    assert not crossbar.parts.hosts.healthy(home)
    leases = crossbar.parts.table.snapshot("convo")
    assert [lease.host for lease in leases] == [survivor, survivor]  # the same two leases
    events = await crossbar.parts.store.list_events(route="convo")
    moves = [(e.from_host, e.to_host) for e in events if e.reason == "unhealthy"]
    assert moves == [(home, survivor)], events


@pytest_twisted.ensureDeferred
async def test_a_client_leaving_mid_stream_frees_the_real_slot_at_once(launch):
    crossbar, fleet = await launch()
    with openai_client(crossbar.url("convo", "/v1")) as client:
        raw = await fleet.within(
            deferToThread(
                client.chat.completions.with_raw_response.create,
                model=MODEL,
                messages=[{"role": "user", "content": "Count from one to a thousand in words."}],
                max_tokens=LONG,
                stream=True,
                extra_body={"ignore_eos": True},  # generate all LONG tokens unless stopped
            ),
            30,
            "the stream's headers",
        )
        host = raw.headers["x-crossbar-host"]
        llama = fleet.llamas[host]
        stream = raw.parse()
        await fleet.within(deferToThread(next, iter(stream)), 30, "the first chunk")
        assert await llama.busy_slots() != []  # the host is generating for this client
        assert crossbar.parts.limiter.in_flight(host, MODEL) == 1
        decoded = await llama.metric("n_decode_total")
        await fleet.within(deferToThread(stream.close), 10, "closing the stream")

    await fleet.within(llama.idle(), 10, "the host's slot going idle")
    await until(lambda: crossbar.parts.limiter.in_flight(host, MODEL) == 0, 5)
    # The generation was cut short, not run to its end: far fewer decodes than LONG.
    assert await llama.metric("n_decode_total") - decoded < LONG / 4
