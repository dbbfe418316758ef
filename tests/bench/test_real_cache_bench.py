"""bench/real/agent_workload.py's workload and token accounting, run against two fake llama-servers with
the two routers that need no proxy, so the bench cannot rot between its real sittings: a
conversation kept on one host reads its earlier turns from that host's prompt cache; one whose
turns rotate over the hosts does not, and the bench counts exactly what the hosts processed."""

import pytest_twisted
from twisted.internet import reactor

from bench.real import agent_workload
from crossbar.testing.fakellama import FakeLlama

# A short system prompt: on the fake, what the conversations share then counts for little, so
# a turn's cached share says whether its own earlier turns were found.
WORKLOAD = agent_workload.Workload(conversations=4, turns=4, at_once=3, system="Be terse.")


async def run(router: str) -> tuple[agent_workload.Row, list[FakeLlama]]:
    fakes = [FakeLlama(reactor, models=[agent_workload.MODEL], parallel=2) for _ in range(2)]
    for fake in fakes:
        await fake.start()
    try:
        chat = [f"{fake.url}/v1/chat/completions" for fake in fakes]
        pick = agent_workload.ideal if router == "ideal" else agent_workload.round_robin
        host_of = agent_workload.sent_to({url: f"h{i}" for i, url in enumerate(chat)})
        results = await agent_workload.run_workload(reactor, pick(chat), WORKLOAD, host_of)
    finally:
        for fake in fakes:
            await fake.stop()
    return agent_workload.summarize(router, results, WORKLOAD), fakes


def assert_counted_what_the_hosts_did(row: agent_workload.Row, fakes: list[FakeLlama]) -> None:
    assert row.answered == row.expected == 16 and not row.error, row.error
    assert not row.timings_stripped
    assert row.prefill == sum(f.counters.prefill_tokens for f in fakes)
    assert row.cached == sum(f.counters.cached_tokens for f in fakes)


@pytest_twisted.ensureDeferred
async def test_the_ideal_router_keeps_each_conversation_on_one_host_and_its_later_turns_cached():
    row, fakes = await run("ideal")
    assert_counted_what_the_hosts_did(row, fakes)
    assert row.first_hosts == ["h0", "h1", "h0", "h1"]
    assert {(t.conversation % 2, t.host) for t in row.turns} == {(0, "h0"), (1, "h1")}
    assert row.later_cached_share > 0.8, row


@pytest_twisted.ensureDeferred
async def test_round_robin_takes_the_hosts_in_turn_and_never_prefills_less_than_the_ideal():
    ideal, _ = await run("ideal")
    row, fakes = await run("round-robin")
    assert_counted_what_the_hosts_did(row, fakes)
    # Every request goes to the next host: the hosts take turns, whatever the interleaving.
    assert [f.counters.requests["/v1/chat/completions"] for f in fakes] == [8, 8]
    # How often a conversation's next turn lands where its last one did depends on how the
    # three conversations interleave, so only this is sure: never better than keeping them.
    assert row.prefill >= ideal.prefill, (row.prefill, ideal.prefill)
    assert agent_workload.with_ratios([ideal, row])[1].ratio == row.prefill / ideal.prefill


def test_a_router_that_strips_timings_is_counted_from_usage():
    answer = {"usage": {"prompt_tokens": 400, "prompt_tokens_details": {"cached_tokens": 350}}}
    assert agent_workload.account(answer) == (50, 350, False)
    with_timings = {**answer, "timings": {"prompt_n": 7, "cache_n": 393}}
    assert agent_workload.account(with_timings) == (7, 393, True)


def test_each_turn_appends_a_new_user_message_and_first_messages_differ():
    firsts = {agent_workload.first_message(i) for i in range(9)}
    assert len(firsts) == 9
    asks = [agent_workload.next_message(t) for t in range(2, 6)]
    assert len(set(asks)) == 4
