"""bench/real/real_valve.py's schedules and streamed accounting, so the bench cannot rot between its
real sittings: every router meets the same schedule, the overload really crowds busy
conversations onto one host of a sticky router's spread, and a streamed turn's first token and
token counts are read from what the hosts sent (two fake llama-servers, the client rotating
straight to them, on real sockets)."""

import pytest
import pytest_twisted
from twisted.internet import reactor

from bench.real import agent_workload, real_valve, valve_workloads
from crossbar.leases.chooser import HostView, pick
from crossbar.testing.fakellama import FakeLlama


def crossbar_spread(conversations: int, hosts: int) -> dict[int, int]:
    """Where crossbar's chooser puts conversations that begin one at a time, each host with one
    slot: every new lease goes where pick() says, given the leases placed so far."""
    leases = [0] * hosts
    placed = {}
    for c in range(conversations):
        views = [HostView(f"h{h}", False, leases[h], 1, 1) for h in range(hosts)]
        host = int(pick(views)[1:])
        leases[host] += 1
        placed[c] = host
    return placed


def test_every_router_meets_the_same_schedule_and_the_seed_alone_changes_its_think_times():
    for workload in valve_workloads.WORKLOADS:
        assert valve_workloads.plan_of(workload) == valve_workloads.plan_of(workload)
    plan = valve_workloads.plan_of("overload")
    other = valve_workloads.plan_of("overload", seed=38)
    assert [p.conversations for p in plan.phases] == [p.conversations for p in other.phases]
    assert [p.thinks for p in plan.phases] != [p.thinks for p in other.phases]
    thinks = [t for p in plan.phases for each in p.thinks for t in each]
    assert all(0 <= t <= 2 for t in thinks) and len(set(thinks)) > 10
    # The busy ones of a round begin it together; they think between their turns only.
    for phase in plan.phases[1:]:
        assert all(each[0] == 0 and len(each) == 3 for each in phase.thinks)


def test_a_conversation_thinks_the_same_whatever_the_rounds_around_it():
    # Its think times are its own stream: adding rounds only appends to them.
    short, long = (
        valve_workloads.plan_of("overload", rounds=3),
        valve_workloads.plan_of("overload", rounds=6),
    )
    assert long.phases[:4] == short.phases
    assert long.expected == 9 + 6 * 4 * 3 and short.expected == 45


def test_conversations_begun_one_at_a_time_spread_over_the_hosts_as_crossbar_places_them():
    for conversations, hosts in ((9, 3), (6, 2)):
        spread = valve_workloads.start_order_spread(conversations, hosts)
        assert spread == crossbar_spread(conversations, hosts)
    plan = valve_workloads.plan_of("overload")
    opening = plan.phases[0]
    assert opening.at_once == 1 and opening.conversations == tuple(range(9))


def test_in_every_overload_round_three_busy_conversations_share_a_host_and_one_host_idles():
    plan = valve_workloads.plan_of("overload")
    spread = crossbar_spread(9, 3)
    assert len(plan.phases) == 4
    for phase in plan.phases[1:]:
        on = [spread[c] for c in phase.conversations]
        crowded = max(set(on), key=on.count)
        assert on.count(crowded) == 3 and len(set(on)) == 2, (phase.name, on)
    # Each host has its crowded round.
    crowded_hosts = {spread[p.conversations[0]] for p in plan.phases[1:]}
    assert crowded_hosts == {0, 1, 2}


def test_the_shape_is_two_busy_conversations_of_one_host_on_two_one_slot_hosts():
    plan = valve_workloads.plan_of("shape")
    spread = crossbar_spread(6, 2)
    assert plan.hosts == 2 and plan.conversations == 6
    assert plan.llama_args[:2] == ("-np", "1")
    assert plan.llama_args[plan.llama_args.index("--cache-ram") + 1] == "512"
    assert "--no-repack" in plan.llama_args
    for phase in plan.phases[1:]:
        assert len(phase.conversations) == 2 and phase.at_once == 2
        assert len({spread[c] for c in phase.conversations}) == 1


def test_the_default_workload_is_real_caches_streamed():
    plan = valve_workloads.plan_of("default")
    assert plan.workload.stream and plan.expected == 45 and plan.hosts == 3
    assert plan.phases[0].at_once == 3 and "--no-repack" in plan.llama_args


def test_no_router_always_goes_first_and_the_order_turns_round():
    routers = list(real_valve.ROUTERS)
    orders = [real_valve.order_of(routers, run) for run in range(1, 4)]
    assert all(sorted(o) == sorted(routers) for o in orders)
    assert len({o[0] for o in orders}) == 3
    assert orders[1] == routers[::-1]
    assert [real_valve.order_of(["a", "b"], run)[0] for run in (1, 2)] == ["a", "b"]


def test_a_stream_is_timed_to_its_first_text_and_counted_from_its_last_chunk():
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n\n'
    text = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
    more = b'data: {"choices":[{"index":0,"delta":{"content":" there"}}]}\n\n'
    last = (
        b'data: {"choices":[],"usage":{"prompt_tokens":40,"prompt_tokens_details":'
        b'{"cached_tokens":30}},"timings":{"prompt_n":10,"cache_n":30}}\n\ndata: [DONE]\n\n'
    )
    # The first text event's end arrives in the third chunk, at t=3.
    chunks = [role, text[:20], text[20:] + more, last]
    streamed = agent_workload.read_stream(chunks, [1.0, 2.0, 3.0, 4.0])
    assert streamed.first_content == 3.0 and streamed.reply == "Hi there"
    assert agent_workload.account(streamed.answer) == (10, 30, True)
    stripped = agent_workload.read_stream(
        [role, text, last.replace(b',"timings"', b',"x"')], [1, 2, 3]
    )
    assert agent_workload.account(stripped.answer) == (10, 30, False)
    assert agent_workload.read_stream([role, last], [1, 2]).first_content is None
    with pytest.raises(ValueError):
        agent_workload.read_stream([b'data: {"error":{"message":"boom"}}\n\n'], [1.0])


def test_the_busy_moves_are_read_from_crossbars_metrics_by_reason():
    text = (
        "# HELP crossbar_lease_moves_total Conversations moved.\n"
        "# TYPE crossbar_lease_moves_total counter\n"
        'crossbar_lease_moves_total{reason="busy"} 3.0\n'
        'crossbar_lease_moves_total{reason="unhealthy"} 1.0\n'
        "# HELP crossbar_lease_moves_created When.\n"
        "# TYPE crossbar_lease_moves_created gauge\n"
        'crossbar_lease_moves_created{reason="busy"} 1.7e9\n'
    )
    assert real_valve.parse_moves(text) == {"busy": 3, "unhealthy": 1}
    assert real_valve.parse_moves("") == {}


@pytest_twisted.ensureDeferred
async def test_streamed_turns_through_round_robin_count_what_the_fakes_did():
    plan = valve_workloads.plan_of("shape", rounds=2, think=0)
    fakes = [FakeLlama(reactor, models=[agent_workload.MODEL], parallel=1) for _ in range(2)]
    for fake in fakes:
        await fake.start()
    try:
        chat = [f"{fake.url}/v1/chat/completions" for fake in fakes]
        host_of = agent_workload.sent_to({url: f"h{i}" for i, url in enumerate(chat)})
        results = await agent_workload.run_phases(
            reactor,
            agent_workload.round_robin(chat),
            plan.workload,
            list(plan.phases),
            host_of,
        )
    finally:
        for fake in fakes:
            await fake.stop()
    row = real_valve.figures(real_valve.RunRow("round-robin", 1, 1, plan.expected), results)
    assert row.whole and row.answered == plan.expected == 6 + 2 * 2 * 3, row.error
    assert not row.timings_stripped and row.no_first_token == 0
    assert row.prefill == sum(f.counters.prefill_tokens for f in fakes)
    assert row.cached == sum(f.counters.cached_tokens for f in fakes)
    assert all(0 < r.ttft_s <= r.seconds for r in results)
    assert row.ttft_p50_s <= row.ttft_p99_s and row.turn_p50_s <= row.turn_p99_s
    # The client rotated: the hosts took turns, and each conversation's turns are numbered on
    # from phase to phase.
    assert [f.counters.requests["/v1/chat/completions"] for f in fakes] == [9, 9]
    assert [r.turn for r in results if r.conversation == 0] == [1, 2, 3, 4]
    # Every request streamed.
    seen = [c for f in fakes for c in f.counters.completions]
    assert all(c.stream for c in seen) and len(seen) == 18
