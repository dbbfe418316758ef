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


def _twistd_text(event):
    """The line twistd's own text observer writes for `event`."""
    from twisted.logger import formatEventAsClassicLogText, formatTime, timeFormatRFC3339

    return formatEventAsClassicLogText(event, lambda when: formatTime(when, timeFormatRFC3339))


def test_crossbar_s_text_observer_writes_the_lines_twistd_writes():
    from twisted.logger import LogLevel
    from twisted.python.failure import Failure

    from crossbar.app.logs import ClassicText

    text = ClassicText()
    events = []
    Logger(namespace="crossbar.request", observer=events.append)
    row = UsageRow(0, "team", "f", "qwen-coder", "titan", "/v1/chat/completions", 429,
                   False, key="ci", error="key 'ci' is over its limit")  # fmt: skip
    globalLogPublisher.addObserver(events.append)
    try:
        log_request(row)
        Logger(namespace="crossbar").warn("reload: {note}", note="a\nb")
        try:
            raise ZeroDivisionError("division by zero")
        except ZeroDivisionError:
            Logger(namespace="crossbar").failure("it broke", Failure())
    finally:
        globalLogPublisher.removeObserver(events.append)
    assert len(events) == 3
    # The same second twice (its stamp reused), the next one, and no time at all.
    for when in (1_700_000_000.2, 1_700_000_000.9, 1_700_000_001.0, None):
        for event in events:
            event = {**event, "log_time": when}
            assert text(event) == _twistd_text(event)
    assert events[0]["log_level"] == LogLevel.info
    assert "[crossbar.request#info] team /v1/chat/completions -> titan" in text(events[0])


def _twistd_options(*argv, config="unused.toml"):
    """twistd's own options, as parsed for `twistd <argv> crossbar -c <config>`."""
    from twisted.scripts.twistd import ServerOptions

    options = ServerOptions()
    options.parseOptions([*argv, "crossbar", "-c", str(config)])
    return options


def test_twistd_in_the_foreground_on_stdout_logs_through_crossbar_s_text_observer():
    from crossbar.app.tap import logs_to_stdout

    assert logs_to_stdout(_twistd_options("-n"))
    assert logs_to_stdout(_twistd_options("-n", "--logfile", "-"))
    # Any logging option of twistd's own is left to twistd; a daemon logs to twistd.log.
    assert not logs_to_stdout(_twistd_options("-n", "--logfile", "crossbar.log"))
    assert not logs_to_stdout(_twistd_options("-n", "--syslog"))
    assert not logs_to_stdout(_twistd_options("-n", "--logger", "crossbar.logs.json_observer"))
    assert not logs_to_stdout(_twistd_options())
    assert not logs_to_stdout(None)


def test_twistd_starts_logging_from_the_observer_the_plugin_set_on_its_application(
    tmp_path, capsys
):
    from twisted.application.app import AppLogger
    from twisted.application.service import Application
    from twisted.logger import FileLogObserver, ILogObserver, LogLevel

    from crossbar.app.logs import ClassicText
    from crossbar.app.tap import makeService

    config = tmp_path / "crossbar.toml"
    config.write_text(
        '[server]\ndb = ":memory:"\n[hosts.titan]\nurl = "http://127.0.0.1:9"\nmodels = ["m"]\n'
        '[routes.convo]\nhosts = ["titan"]\n'
    )
    chosen = {}
    for argv in (("-n",), ("-n", "--logfile", str(tmp_path / "crossbar.log"))):
        options = _twistd_options(*argv, config=config)
        application = Application("crossbar")  # as twistd makes it for a plugin
        makeService(options.subOptions).setServiceParent(application)
        chosen[argv[-1]] = application.getComponent(ILogObserver)
    observer = chosen["-n"]
    assert isinstance(observer, FileLogObserver)
    event = {"log_namespace": "crossbar.request", "log_format": "{line}", "line": "x -> y",
             "log_level": LogLevel.info, "log_time": 1_700_000_000.0}  # fmt: skip
    observer(event)
    assert capsys.readouterr().out == ClassicText()(event) == _twistd_text(event)
    assert chosen[str(tmp_path / "crossbar.log")] is None  # twistd's own LogFile, rotation and all
    # twistd's AppLogger takes the application's observer over its own.
    logger = AppLogger(_twistd_options("-n", config=config))
    assert logger._observerFactory is None
