"""Every shell and Python snippet in README.md and docs/ runs as pasted against the demo.

The demo's two fake llama-servers and crossbar (examples/demo.toml) are started on free ports
with a temporary db, and each snippet runs in the repository's root with `.venv/bin` first on
PATH and CROSSBAR_ADMIN set, as after `make venv`. The only rewrite is of where crossbar is:
`http://crossbar:8080` and `http://127.0.0.1:8080` become its client URL, `127.0.0.1:8081` its
admin port. A snippet fails on a non-zero exit status, a traceback or an error answer.
Snippets the doc marks as not run (see tests/doc_snippets.py) are listed with their reason.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from crossbar.demo.launch import Knobs, free_ports, start_crossbar, start_fakes, wait_ready
from crossbar.demo.plan import read_plan, rewrite
from crossbar.demo.processes import Processes
from tests.support.doc_snippets import ROOT, Snippet, snippets

BIN = Path(sys.executable).parent
RUN_SECONDS = 240  # one snippet (a dozen ctl commands on a busy machine); a hung one fails


def test_a_python_snippet_starts_from_its_imports_and_names_nothing_undefined():
    for snippet in snippets():
        if snippet.kind == "other":
            try:
                tree = ast.parse(snippet.text)
            except SyntaxError:
                continue
            calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
            assert not calls, f"{snippet.where}: Python without its imports cannot run as pasted"
        if snippet.kind != "python":
            continue
        checked = subprocess.run(
            [str(BIN / "ruff"), "check", "--select", "F821,F841", "--stdin-filename", "s.py", "-"],
            input=snippet.text,
            capture_output=True,
            text=True,
        )
        assert checked.returncode == 0, f"{snippet.where}:\n{checked.stdout}"


def test_every_snippet_not_run_says_why():
    for snippet in snippets():
        if snippet.skip:
            assert snippet.kind in ("shell", "python", "bench"), f"{snippet.where}: never run"
            assert len(snippet.skip) > 10, f"{snippet.where}: say why it is not run"


@pytest.fixture(scope="module")
def demo():
    """(client URL, admin URL) of the demo on free ports; everything stopped afterwards."""
    work = Path(tempfile.mkdtemp(prefix="crossbar-snippets-"))
    processes = Processes(work, record_pids=False)
    try:
        plan = read_plan(ROOT / "examples" / "demo.toml")
        urls = start_fakes(processes, plan, Knobs(0, 0), any_port=True)  # answers at once
        listen, admin = free_ports(2)
        config = work / "demo.toml"
        config.write_text(rewrite(plan, urls, listen, admin, str(work / "crossbar.db")))
        plan = read_plan(config)
        wait_ready(plan, start_crossbar(processes, config))
        yield plan.base, plan.admin_url.rstrip("/")
    finally:
        processes.stop()
        shutil.rmtree(work, ignore_errors=True)


def _run(snippet: Snippet, base: str, admin: str) -> subprocess.CompletedProcess[str]:
    admin_host = admin.removeprefix("http://")
    text = (
        snippet.text.replace("http://crossbar:8080", base)
        .replace("http://127.0.0.1:8080", base)
        .replace("127.0.0.1:8081", admin_host)
    )
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "CROSSBAR_ADMIN": admin,
    }
    argv = [sys.executable, "-"] if snippet.kind == "python" else ["bash", "-eo", "pipefail"]
    return subprocess.run(
        argv, input=text, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_SECONDS
    )


RUNNABLE = [s for s in snippets() if s.kind in ("shell", "python") and not s.skip]


def test_the_guides_clients_and_ctl_commands_are_among_the_snippets_run():
    assert len(RUNNABLE) >= 8, [s.where for s in RUNNABLE]


@pytest.mark.timeout(RUN_SECONDS + 30)
@pytest.mark.parametrize("snippet", RUNNABLE, ids=[s.where for s in RUNNABLE])
def test_a_shell_or_python_snippet_runs_as_pasted_against_the_demo(demo, snippet):
    base, admin = demo
    done = _run(snippet, base, admin)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"exit {done.returncode}:\n{snippet.text}{output}"
    assert "Traceback" not in output and '"error"' not in output, f"{snippet.text}{output}"
