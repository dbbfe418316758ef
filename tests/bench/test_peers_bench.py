"""bench/peers/peers.py's pieces that need no router, so the bench cannot rot between its sittings:
the bodies it posts, its CPU accounting from /proc/<pid>/stat, its reading of wrk's report,
the wrk script it writes and the table it prints from a run's results."""

import argparse
import json
import os

import pytest

from bench.common import measure, wrk_report
from bench.peers import agent_bodies, peers, peers_setup
from crossbar.wire.bodies import chat_opening

WRK_REPORT = """\
Running 10s test @ http://127.0.0.1:24001
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   420.12us  101.50us   8.20ms   91.00%
    Req/Sec    74.10k     2.01k   77.00k    70.00%
  Latency Distribution
     50%  401.00us
     75%  450.00us
     90%  510.00us
     99%    1.25ms
  737210 requests in 10.00s, 258.00MB read
  Non-2xx or 3xx responses: 12
  Socket errors: connect 0, read 2, write 0, timeout 1
Requests/sec:  73720.51
Transfer/sec:     25.80MB
"""


def test_each_conversation_opens_its_own_way_so_crossbar_leases_each():
    for kind in peers.BODIES:
        one, two = (json.loads(agent_bodies.body_for(kind, n)) for n in (1, 2))
        assert one["model"] == peers_setup.MODEL and one["max_tokens"] == 1
        assert chat_opening(one) != chat_opening(two)  # crossbar fingerprints the opening
        assert "Conversation 1:" in one["messages"][-1 if kind == "small" else 1]["content"]


def test_the_agent_body_is_about_100_kb_of_system_prompt_tools_and_tool_results():
    body = agent_bodies.body_for("100k", 7)
    assert 95 * 1024 <= len(body) <= 105 * 1024
    chat = json.loads(body)
    roles = [m["role"] for m in chat["messages"]]
    assert roles[:2] == ["system", "user"] and roles[-1] == "user"
    assert roles.count("tool") >= 20 and roles.count("assistant") == roles.count("tool")
    assert len(chat["messages"][0]["content"]) > 20_000
    assert [t["function"]["name"] for t in chat["tools"]][:2] == ["read_file", "grep"]
    assert (
        agent_bodies.agent_body() == agent_bodies.agent_body()
    )  # deterministic: every sitting posts this


def test_cpu_ticks_come_from_a_stat_line_whose_command_has_spaces_and_parentheses():
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime ...
    line = "4242 (smg (router) x) S 17 4242 4242 0 -1 4194560 9 0 0 0 150 25 3 2 20 0 13 0\n"
    assert measure.stat_fields(line)[1] == "17"
    assert measure.stat_ticks(line) == 150 + 25 + 3 + 2


def test_a_router_s_cpu_is_its_process_tree_s():
    def stat(pid: int, ppid: int, utime: int) -> str:
        return f"{pid} (p {pid}) S {ppid} 1 1 0 -1 0 0 0 0 0 {utime} 1 0 0 20 0 1 0\n"

    stats = {10: stat(10, 1, 100), 11: stat(11, 10, 5), 12: stat(12, 11, 7), 13: stat(13, 1, 99)}
    assert sorted(measure.tree(10, stats)) == [10, 11, 12]
    assert measure.tree(99, stats) == []
    assert sum(measure.stat_ticks(stats[p]) for p in measure.tree(10, stats)) == 101 + 6 + 8
    own = measure.tree_cpu_seconds(os.getpid())
    assert own >= sum(os.times()[:2]) - 0.05  # this process at least (and pytest's children)


def test_wrk_s_report_is_read_with_its_latency_distribution_and_errors():
    r = wrk_report.parse_wrk(WRK_REPORT)
    assert r["requests"] == 737210 and r["seconds"] == 10.0 and r["rps"] == 73720.51
    assert r["p50_ms"] == pytest.approx(0.401) and r["p99_ms"] == pytest.approx(1.25)
    assert r["non2xx"] == 12 and r["socket_errors"] == 3
    bare = WRK_REPORT.replace("     99%    1.25ms\n", "").replace("  Socket errors", "  X")
    assert (
        wrk_report.parse_wrk(bare)["p99_ms"] is None
        and wrk_report.parse_wrk(bare)["socket_errors"] == 0
    )
    with pytest.raises(ValueError, match="not a wrk report"):
        wrk_report.parse_wrk("unable to connect to 127.0.0.1:24001 Connection refused")


def test_the_wrk_script_rotates_the_conversations_and_names_a_session_only_when_asked(tmp_path):
    sitting = peers.Sitting(argparse.Namespace(), None, tmp_path)
    plain = peers.write_script(sitting, "small", session_header=False).read_text()
    keyed = peers.write_script(sitting, "small", session_header=True).read_text()
    assert "n = n % 1000 + 1" in plain and 'local session = ""' in plain
    assert 'local session = "X-Session-ID"' in keyed
    before = (tmp_path / "body-small.before").read_bytes()
    after = (tmp_path / "body-small.after").read_bytes()
    assert before + b"3" + after == agent_bodies.body_for("small", 3)


def test_the_table_gives_added_latency_over_direct_and_a_failed_router_s_reason(capsys):
    def result(p50: float, p99: float, rps: float, cpu: float | None) -> dict:
        wrk = {"requests": 100, "rps": rps, "p50_ms": p50, "p99_ms": p99, "non2xx": 0,
               "socket_errors": 0}  # fmt: skip
        return {"loaded": wrk, "single": wrk, "cpu_us_per_request": cpu,
                "c1_cpu_us_per_request": cpu}  # fmt: skip

    runs = [
        {
            "rows": {
                "direct": {"small": result(0.05, 0.1, 9000, None)},
                "crossbar": {"small": result(0.85, 1.4, 1500, 600)},
                "smg": {"small": {"error": "smg exited at start; its log:"}},
            },
            "streams": {
                "crossbar": {
                    "chunks": 1000,
                    "us_per_chunk": 40.0,
                    "cpu_percent": 30,
                    "gap_p99_ms": 104.0,
                    "errors": 0,
                }
            },
        }
    ]
    summary = peers.summarize(runs, ["direct", "crossbar", "smg"], ["small"])
    crossbar = summary["table"][1]
    assert crossbar["added_p50_ms"] == pytest.approx(0.8)
    assert crossbar["added_p99_ms"] == pytest.approx(1.3)
    assert summary["table"][2]["failures"] == ["smg exited at start; its log:"]
    args = argparse.Namespace(duration=10.0, runs=1, streams=1000, stream_rate=10.0)
    peers.report(summary, args, {"vllm-router": "not installed\npip's log"})
    out = capsys.readouterr().out
    assert "| crossbar | small | 0.800 ms | 1.300 ms | 1,500 | 600 |  |" in out
    assert "| smg 1.13.0 cache_aware | small | - | - | - | - | failed: smg exited" in out
    assert "| crossbar | 1,000 | 40.0 | 30 | 104.0 |  |" in out
    assert "vllm-router 0.1.17 cache_aware: skipped (not installed)" in out


def test_direct_is_always_measured_and_unknown_names_are_refused(capsys):
    args = peers.parse_args(["--routers", "smg,nginx", "--bodies", "100k"])
    assert args.routers == ["direct", "nginx", "smg"] and args.bodies == ["100k"]
    with pytest.raises(SystemExit):
        peers.parse_args(["--routers", "haproxy"])
    assert "unknown haproxy" in capsys.readouterr().err


def test_crossbar_ab_reads_each_variant_s_name_settings_and_python():
    from bench.peers import crossbar_ab

    assert crossbar_ab.parse_variant("after=") == ("after", {})
    assert crossbar_ab.parse_variant("before=PYBIN=../b/.venv/bin/python,CROSSBAR_PURE=1") == (
        "before",
        {"PYBIN": "../b/.venv/bin/python", "CROSSBAR_PURE": "1"},
    )
