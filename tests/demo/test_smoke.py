"""The smoke run passes: real processes (two fakes and crossbar under twistd), real HTTP.

`python -m crossbar.demo smoke` picks free ports and a temporary db itself, so it runs beside a
running `make demo` and beside other test runs. Its own polling has deadlines; this test only
waits for the process (with a timeout) and reads its verdict.
"""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_smoke_run_passes_and_stops_what_it_started():
    done = subprocess.run(
        [sys.executable, "-m", "crossbar.demo", "smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    report = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.returncode == 0, report
    assert "smoke: ok" in done.stdout, report
    # one line per turn: two conversations, three turns each
    turns = re.findall(r"^  [AB]  turn [123]  host ", done.stdout, re.MULTILINE)
    assert len(turns) == 6, report


def test_the_smoke_run_fails_with_a_message_on_a_config_it_cannot_use(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[server]\nlisten = "tcp:8080"\n[hosts.far]\nurl = "http://10.0.0.5:8080"\n')
    done = subprocess.run(
        [sys.executable, "-m", "crossbar.demo", "smoke", "--config", str(bad)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert "hosts.far.url: the demo fakes hosts on this machine" in done.stderr
