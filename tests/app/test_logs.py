"""Operators read one line per request; machines read JSON records."""

import json
import subprocess
import sys
from pathlib import Path

from twisted.logger import Logger, formatEvent, globalLogPublisher

from crossbar.app.logs import log_request
from crossbar.records import UsageRow

TWISTD = str(Path(sys.executable).parent / "twistd")


def test_a_request_line_names_route_host_model_status_lease_timings_and_tokens():
    events = []
    globalLogPublisher.addObserver(events.append)
    try:
        log_request(
            UsageRow(
                at=0,
                route="convo",
                fp="f",
                model="qwen-coder",
                host="titan",
                path="/v1/chat/completions",
                status=200,
                stream=True,
                prompt_tokens=120,
                cached_tokens=100,
                completion_tokens=16,
                queue_ms=12.0,
                ttfb_ms=340.4,
                duration_ms=900,
                lease="reused",
            )
        )
    finally:
        globalLogPublisher.removeObserver(events.append)
    lines = [formatEvent(e) for e in events if e.get("log_namespace") == "crossbar.request"]
    assert lines == [
        "convo /v1/chat/completions -> titan qwen-coder 200 lease=reused queue=12ms "
        "ttfb=340ms tokens=120/100/16"
    ]


def test_twistd_with_the_json_logger_writes_json_records(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(
        '[server]\nlisten = "tcp:0:interface=127.0.0.1"\nadmin_listen = "tcp:0:interface=127.0.0.1"\n'
        'db = ":memory:"\nhealth_timeout = "200ms"\n'
        '[hosts.titan]\nurl = "http://127.0.0.1:1"\nmodels = ["m"]\n[routes.x]\nhosts = ["titan"]\n'
    )
    process = subprocess.Popen(
        [
            TWISTD,
            "-n",
            "--pidfile=",
            "--logger",
            "crossbar.logs.json_observer",
            "crossbar",
            "-c",
            str(config),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    try:
        seen = b""
        while b"crossbar listening" not in seen:  # readline ends at each record's newline
            line = process.stdout.readline()
            assert line, process.stderr.read().decode()
            seen += line
    finally:
        process.terminate()
        rest, _ = process.communicate(timeout=30)
    records = [json.loads(r) for r in (seen + rest).decode().split("\x1e") if r.strip()]
    listening = [r for r in records if r.get("log_format", "").startswith("crossbar listening")]
    assert listening and listening[0]["log_namespace"] == "crossbar"
    assert any(r.get("log_format") == "crossbar stopped" for r in records)


def test_the_json_observer_writes_one_parseable_record_per_event(capsys):
    from crossbar.app.logs import json_observer

    observer = json_observer()
    Logger(namespace="crossbar.request", observer=observer).info("hello {who}", who="operator")
    out = capsys.readouterr().out
    records = [json.loads(r) for r in out.split("\x1e") if r.strip()]
    assert records[0]["who"] == "operator"
    assert records[0]["log_namespace"] == "crossbar.request"


def test_a_named_keys_request_line_names_the_key():
    events = []
    globalLogPublisher.addObserver(events.append)
    try:
        row = UsageRow(0, "team", "f", "qwen-coder", "titan", "/v1/chat/completions", 429,
                       False, key="ci", error="key 'ci' is over its limit")  # fmt: skip
        log_request(row)
    finally:
        globalLogPublisher.removeObserver(events.append)
    (line,) = [formatEvent(e) for e in events if e.get("log_namespace") == "crossbar.request"]
    assert line.endswith("tokens=0/0/0 key=ci error=\"key 'ci' is over its limit\"")
