"""bench/real/real_models.py's scenarios and arithmetic, so the bench cannot rot between its real
sittings: the floor puts the busiest model on a host of its own, the workload begins every
conversation one at a time and then runs three at a time, and a run's row reads its turns."""

from bench.real import real_models
from bench.real.agent_workload import TurnResult


def test_the_floor_gives_the_busiest_model_a_host_of_its_own():
    assert real_models.floor_of(real_models.SCENARIOS["two"]) == {"coder": 0, "chat": 1}
    skewed = real_models.floor_of(real_models.SCENARIOS["skewed"])
    assert skewed["coder"] != skewed["chat"] == skewed["vision"]
    three = real_models.floor_of(real_models.SCENARIOS["three"])
    assert sorted(three.values()) == [0, 0, 1]  # two models a host at most


def test_conversations_begin_one_at_a_time_then_take_three_turns_three_at_a_time():
    begin, turns = real_models.phases(real_models.SCENARIOS["two"])
    assert (begin.at_once, begin.turns) == (1, 8)
    assert (turns.at_once, turns.turns) == (3, 24)


def test_a_runs_row_reads_its_turns_and_counts_the_failed():
    results = [TurnResult(0, 1, seconds=1.0, status=200, prompt_n=100, ttft_s=0.5),
               TurnResult(1, 1, seconds=3.0, status=200, prompt_n=50, ttft_s=2.0),
               TurnResult(2, 1, seconds=0.1, status=500, error="HTTP 500: proxy error")]  # fmt: skip
    row = real_models.row("crossbar", results)
    assert (row.turns, row.failed, row.prefill) == (2, 1, 150)
    assert (row.ttft_p50_s, row.turn_p99_s) == (0.5, 3.0)
    assert real_models.spread([4, 2, 3], 0) == "3 (2-4)"
