"""examples/systemd/crossbar.service and the template crossbar@.service (one unit per instance
sharing a store): valid for systemd, hardened, reloading by SIGHUP after a config check, and
running the twistd plugin as it expects to be run."""

from __future__ import annotations

import pathlib
import shlex
import shutil
import subprocess
import sys

import pytest

from crossbar.app.tap import Options

UNITS = pathlib.Path(__file__).resolve().parents[2] / "examples" / "systemd"
# Each unit and the config file it runs with.
CONFIGS = {
    "crossbar.service": "/etc/crossbar/config.toml",
    "crossbar@.service": "/etc/crossbar/instance-%i.toml",
}
each_unit = pytest.mark.parametrize(("name", "config"), list(CONFIGS.items()))
ANALYZE = shutil.which("systemd-analyze")
INSTALLED = "/opt/crossbar/.venv/bin/"


def directives(text: str) -> dict[str, list[str]]:
    """Key -> values of a unit file, in order (a key may repeat)."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;[":
            continue
        key, _, value = line.partition("=")
        found.setdefault(key, []).append(value)
    return found


def trailing_comments(text: str) -> list[str]:
    """Lines whose value goes on into a comment: systemd would take the comment as part of
    the value (and mostly ignore the setting)."""
    return [
        line
        for line in text.splitlines()
        if line.strip() and line.strip()[0] not in "#;[" and ("  #" in line or " # " in line)
    ]


@each_unit
def test_no_setting_has_a_comment_on_its_line(name, config):
    assert trailing_comments("TimeoutStopSec=60  # longer than shutdown_grace\nA=b\n# ok") == [
        "TimeoutStopSec=60  # longer than shutdown_grace"
    ]
    assert trailing_comments((UNITS / name).read_text()) == []


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed here")
@each_unit
def test_systemd_analyze_verify_accepts_the_unit_without_a_warning(tmp_path, name, config):
    # verify wants the commands to exist: point them at this checkout's virtualenv.
    here = pathlib.Path(sys.executable).parent
    unit = tmp_path / name.replace("@.", "@1.")  # a template is verified as an instance
    unit.write_text((UNITS / name).read_text().replace(INSTALLED, f"{here}/"))
    done = subprocess.run(
        [ANALYZE, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    about_it = [line for line in (done.stdout + done.stderr).splitlines() if unit.name in line]
    assert done.returncode == 0 and about_it == [], done.stdout + done.stderr


@each_unit
def test_the_unit_is_hardened_and_may_write_only_its_state_directory(name, config):
    d = directives((UNITS / name).read_text())
    expected = {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectControlGroups": "yes",
        "RestrictSUIDSGID": "yes",
        "CapabilityBoundingSet": "",
        "StateDirectory": "crossbar",
        "WorkingDirectory": "/var/lib/crossbar",
        "ReadWritePaths": "/var/lib/crossbar",
    }
    assert {key: d[key][-1] for key in expected} == expected
    assert d["RestrictAddressFamilies"] == ["AF_INET AF_INET6 AF_UNIX"]
    assert d["User"] == ["crossbar"]


@each_unit
def test_reload_checks_the_config_then_sends_sighup_and_stop_outlasts_the_grace(name, config):
    d = directives((UNITS / name).read_text())
    assert d["ExecReload"] == [
        f"{INSTALLED}crossbar check {config}",
        "/bin/kill -HUP $MAINPID",
    ]
    assert d["KillSignal"] == ["SIGTERM"]
    assert int(d["TimeoutStopSec"][0]) > 30  # shutdown_grace's default
    assert d["RestartPreventExitStatus"] == ["2"]  # a bad config: crossbar exits 2


@each_unit
def test_execstart_runs_the_twistd_plugin_in_the_foreground_with_its_config(name, config):
    (start,) = directives((UNITS / name).read_text())["ExecStart"]
    argv = shlex.split(start)
    assert argv[0] == f"{INSTALLED}twistd" and "--nodaemon" in argv and "--pidfile=" in argv
    options = Options()
    options.parseOptions(argv[argv.index("crossbar") + 1 :])
    assert options["config"] == config


@each_unit
def test_systemd_is_told_when_crossbar_listens_and_kills_a_frozen_one(name, config):
    found = directives((UNITS / name).read_text())
    assert found["Type"] == ["notify"] and found["NotifyAccess"] == ["main"]
    assert found["WatchdogSec"] == ["10s"]
