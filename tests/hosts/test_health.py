"""The pieces of a probe: reasons, /props parsing, the threshold state machine."""

from __future__ import annotations

import pytest
from twisted.internet import error
from twisted.python.failure import Failure
from twisted.web.client import ResponseFailed, ResponseNeverReceived

from crossbar.hosts.health import (
    Health,
    Probe,
    ProbeTimeout,
    Props,
    failure_reason,
    parse_props,
    status_reason,
)


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (ProbeTimeout(2), "timeout (no answer within 2s)"),
        (error.ConnectionRefusedError(), "refused"),
        (error.TCPTimedOutError(), "connect timeout"),
        (error.TimeoutError(), "connect timeout"),
        (error.DNSLookupError("nope"), "DNS lookup failed"),
        (ResponseNeverReceived([Failure(error.ConnectionLost())]), "reset (connection closed"),
        (ResponseFailed([Failure(error.ConnectionLost())]), "reset (connection lost)"),
        (error.ConnectionLost(), "reset (connection lost)"),
        (error.NoRouteError(), "connect failed: NoRouteError"),
        (ValueError("odd\nthing"), "error: ValueError: odd thing"),
    ],
)
def test_failure_reasons_are_short_and_named(exc: BaseException, reason: str):
    assert failure_reason(exc).startswith(reason)


def test_status_reason_quotes_llama_servers_error_message():
    body = b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'
    assert status_reason(503, body) == "status 503: Loading model"
    assert status_reason(500, b'{"error": "boom"}') == "status 500: boom"
    assert status_reason(502, b"<html>\nBad gateway</html>") == "status 502: <html>"
    assert status_reason(404, b"") == "status 404"
    assert len(status_reason(500, b"x" * 5000)) < 140


def test_parse_props_reads_slots_and_context():
    body = b'{"total_slots": 4, "default_generation_settings": {"n_ctx": 65536}}'
    assert parse_props(body) == Props(total_slots=4, n_ctx=65536)


@pytest.mark.parametrize(
    "body",
    [
        b"{}",
        b'{"total_slots": 0, "default_generation_settings": {"n_ctx": -1}}',
        b'{"total_slots": true, "default_generation_settings": []}',
        b'{"total_slots": "4"}',
    ],
)
def test_parse_props_ignores_what_is_missing_or_nonsense(body: bytes):
    assert parse_props(body) == Props(total_slots=None, n_ctx=None)


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]"])
def test_parse_props_refuses_what_is_not_a_json_object(body: bytes):
    with pytest.raises(ValueError):
        parse_props(body)


def good(at: float = 0) -> Probe:
    return Probe(at, True, "status 200")


def bad(at: float = 0) -> Probe:
    return Probe(at, False, "refused")


def test_health_flips_at_the_thresholds():
    h = Health()
    assert [h.record(bad(), 2, 3) for _ in range(2)] == [False, True]
    assert not h.healthy and h.reason == "2 failed probes, last: refused"
    assert [h.record(good(), 2, 3) for _ in range(3)] == [False, False, True]
    assert h.healthy and h.flips == 2


def test_a_passive_failure_flips_once_and_voids_probes_under_way():
    h = Health()
    epoch = h.epoch
    assert h.fail("reset", unhealthy_after=3)
    assert not h.fail("reset again", unhealthy_after=3)
    assert h.epoch == epoch + 2 and h.flips == 1 and h.bad == 3
    assert h.reason == "request failed: reset"
