"""The smoke run's own rules: what counts as a wrong answer, and how it moves the demo config."""

import pathlib
import tomllib

import pytest

from crossbar.demo.chat import Turn
from crossbar.demo.checks import check_turns
from crossbar.demo.plan import DemoError, endpoint_port, read_plan, rewrite

DEMO = pathlib.Path(__file__).resolve().parents[2] / "examples" / "demo.toml"


def turn(conversation, number, host, lease, cached):
    return Turn(conversation, number, host, lease, 100, cached, 10.0, 0.1)


def good_turns():
    return [
        turn("A", 1, "titan", "new", 0),
        turn("B", 1, "atlas", "new", 0),
        turn("A", 2, "titan", "reused", 80),
        turn("B", 2, "atlas", "reused", 80),
    ]


def test_sticky_cached_conversations_on_two_hosts_pass():
    assert check_turns(good_turns()) == []


def test_a_conversation_that_moves_fails():
    turns = good_turns()
    turns[2] = turn("A", 2, "atlas", "reused", 80)
    problems = check_turns(turns)
    assert "conversation A moved between hosts: titan -> atlas" in problems


def test_no_cache_hit_at_turn_two_fails():
    turns = good_turns()
    turns[3] = turn("B", 2, "atlas", "reused", 0)
    assert check_turns(turns) == [
        "conversation B turn 2: no cached prompt tokens (prompt 100) although its host "
        "served turn 1"
    ]


def test_two_conversations_on_one_host_fail():
    turns = [turn(t.conversation, t.number, "titan", t.lease, t.cached) for t in good_turns()]
    problems = check_turns(turns)
    assert problems == [
        "the conversations share a host although another was free: A on titan, B on titan"
    ]


def test_a_lease_that_is_not_new_then_reused_fails():
    turns = good_turns()
    turns[0] = turn("A", 1, "titan", "reused", 0)
    assert check_turns(turns) == [
        "conversation A: X-Crossbar-Lease was reused, reused; expected new, then reused"
    ]


def test_the_demo_config_is_what_the_demo_runs():
    plan = read_plan(DEMO)
    assert (plan.listen_port, plan.admin_port) == (8080, 8081)
    assert [(h.name, h.port, h.models, h.parallel) for h in plan.hosts] == [
        ("titan", 9101, ("qwen-coder",), 2),
        ("atlas", 9102, ("qwen-coder",), 2),
    ]
    assert (plan.route, plan.model, plan.template_route) == ("convo", "qwen-coder", "proj-smoke")
    assert plan.route_url("/v1") == "http://127.0.0.1:8080/r/convo/v1"


def test_the_smoke_config_moves_ports_and_db_and_keeps_the_rest():
    plan = read_plan(DEMO)
    urls = {"titan": "http://127.0.0.1:40001", "atlas": "http://127.0.0.1:40002"}
    moved = tomllib.loads(rewrite(plan, urls, 40003, 40004, "/tmp/x/crossbar.db"))
    original = tomllib.loads(plan.text)
    assert moved["server"]["listen"] == "tcp:40003:interface=127.0.0.1"
    assert moved["server"]["admin_listen"] == "tcp:40004:interface=127.0.0.1"
    assert moved["server"]["db"] == "/tmp/x/crossbar.db"
    assert moved["hosts"]["atlas"]["url"] == "http://127.0.0.1:40002"
    assert moved["routes"] == original["routes"]
    assert moved["templates"] == original["templates"]


@pytest.mark.parametrize(
    ("description", "port"),
    [("tcp:8080", 8080), ("tcp:8080:interface=127.0.0.1", 8080), ("tcp:port=9:backlog=5", 9)],
)
def test_endpoint_ports(description, port):
    assert endpoint_port(description, "server.listen") == port


def test_an_endpoint_the_demo_cannot_dial_is_named():
    with pytest.raises(DemoError, match=r"server.listen: the demo needs a tcp endpoint"):
        endpoint_port("unix:/run/crossbar.sock", "server.listen")
