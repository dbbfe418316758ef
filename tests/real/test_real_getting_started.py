"""docs/getting-started.md, run as a reader runs it, against two real llama-servers.

Every snippet the page marks `<!-- snippet: real llama-server -->` runs in page order, in one
working directory, with `.venv/bin` first on PATH: a shell snippet with `bash -eo pipefail`, a
Python one with this interpreter. Its text is rewritten only where it names where things are:

- `http://192.168.1.11:8080` and `http://192.168.1.12:8080`, the page's llama-servers, become
  the URLs of two real llama-servers started here (tests/real's flags, the tiny model under the
  alias `qwen-coder`, as the page's `--alias`);
- `--port 8080`, crossbar's port given to `crossbar init`, becomes a free port P whose next port
  is free too (init puts the admin API there), and `localhost:8080` becomes `127.0.0.1:P`;
- `crossbar ctl`, which the page runs with its default admin URL (`http://127.0.0.1:8081`, the
  port after the page's 8080), finds `http://127.0.0.1:P+1` in CROSSBAR_ADMIN.

`twistd -n crossbar -c crossbar.toml` runs in the foreground on the page; here it runs in the
background (its own process group, stopped at the end), and the page goes on once its admin API
answers. A snippet that exits non-zero, prints a traceback or gets an error answer fails the
test, and so does a traceback in crossbar's log. The page's story is checked as it tells it: the
conversation keeps its host with its history read from the cache, the Anthropic client's Claude
model is answered by the route's, the evacuation moves gpu1's two conversations to gpu2
prewarmed, and the curl conversation's next turn there is `reused` and cached. The commands that README.md and the
operator guide mark for a real llama-server are the page's own.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.real.llamas import Fleet, Llama, server_args
from tests.support.doc_snippets import ROOT, Snippet, snippets

PAGE = ROOT / "docs" / "getting-started.md"
BIN = Path(sys.executable).parent
LLAMAS = {"http://192.168.1.11:8080": "gpu1", "http://192.168.1.12:8080": "gpu2"}
SNIPPET_SECONDS = 120  # the slowest: three chat turns on one CPU thread each
READY_SECONDS = 60


def page_snippets() -> list[Snippet]:
    """The page's snippets this test runs, in reading order."""
    return [s for s in snippets() if s.path == PAGE and s.skip == "needs a real llama-server"]


def free_pair() -> int:
    """A free port P whose next port P+1 is free too."""
    for _ in range(100):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise AssertionError("no two free ports in a row")


def get(url: str) -> int:
    """The status of `GET url`, 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def wait_for(url: str, fleet: Fleet, process: subprocess.Popen | None, what: str) -> None:
    """Until `url` answers 200; fail at once when a llama-server or `process` dies."""
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if get(url) == 200:
            return
        assert not (died := fleet.deaths()), f"{what}: " + "\n".join(died)
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{what}: it exited with {process.returncode}")
        time.sleep(0.1)
    raise AssertionError(f"{what}: {url} did not answer 200 in {READY_SECONDS} s")


def rewrite(text: str, urls: dict[str, str], port: int) -> str:
    for page_url, name in LLAMAS.items():
        text = text.replace(page_url, urls[name])
    return text.replace("--port 8080", f"--port {port}").replace(
        "localhost:8080", f"127.0.0.1:{port}"
    )


def test_the_getting_started_page_runs_as_written_against_real_llama_servers(tmp_path):
    steps = page_snippets()
    assert [s.text.split()[:3] for s in steps][:3] == [
        ["crossbar", "init", "gpu1=http://192.168.1.11:8080"],
        ["crossbar", "check", "crossbar.toml"],
        ["twistd", "-n", "crossbar"],
    ]
    elsewhere = [s.text for s in snippets() if s.path != PAGE and s.skip == steps[0].skip]
    assert elsewhere and set(elsewhere) <= {s.text for s in steps}  # README's, the guide's
    args = [*server_args(4096, 2)]  # --alias qwen-coder, as the page starts them
    fleet = Fleet({name: Llama.start(name, tmp_path, args) for name in ("gpu1", "gpu2")})
    work = tmp_path / "work"
    work.mkdir()
    port = free_pair()
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "CROSSBAR_ADMIN": f"http://127.0.0.1:{port + 1}",
    }
    crossbar: subprocess.Popen | None = None
    log = tmp_path / "crossbar.log"
    outputs: list[str] = []
    started = time.monotonic()
    try:
        for llama in fleet.llamas.values():
            wait_for(llama.url + "/health", fleet, None, f"llama-server {llama.name}")
        urls = {name: llama.url for name, llama in fleet.llamas.items()}
        for snippet in steps:
            text = rewrite(snippet.text, urls, port)
            if text.startswith("twistd "):
                crossbar = _spawn(text, work, env, log)
                wait_for(f"http://127.0.0.1:{port + 1}/api/status", fleet, crossbar, "crossbar")
                outputs.append("")
                continue
            outputs.append(_run(snippet, text, work, env, fleet))
        print(f"\ngetting started, {len(steps)} snippets: {time.monotonic() - started:.1f} s")
    finally:
        if crossbar is not None:
            _stop(crossbar)
        deaths = fleet.stop()
    assert not deaths, "\n".join(deaths)
    said = log.read_text() if log.exists() else ""
    assert "Traceback" not in said, said[-3000:]
    _the_story_holds(steps, outputs, work)


def _spawn(text: str, work: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    """The foreground `twistd` snippet, in the background, in a process group of its own; it
    dies with the test run (setpriv --pdeathsig; bash execs a lone command)."""
    argv = ["bash", "-c", text]
    if shutil.which("setpriv"):
        argv = ["setpriv", "--pdeathsig", "TERM", "--", *argv]
    with log.open("wb") as out:
        return subprocess.Popen(argv, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def _run(snippet: Snippet, text: str, work: Path, env: dict[str, str], fleet: Fleet) -> str:
    argv = [sys.executable, "-"] if snippet.kind == "python" else ["bash", "-eo", "pipefail"]
    try:
        done = subprocess.run(argv, input=text, cwd=work, env=env, capture_output=True,
                              text=True, timeout=SNIPPET_SECONDS)  # fmt: skip
    except subprocess.TimeoutExpired:
        died = "\n".join(fleet.deaths())
        raise AssertionError(
            f"{snippet.where}: no end in {SNIPPET_SECONDS} s\n{text}{died}"
        ) from None
    output = done.stdout + done.stderr
    where = f"{snippet.where} (exit {done.returncode}):\n{text}{output}"
    assert done.returncode == 0, where + "\n".join(fleet.deaths())
    assert "Traceback" not in output and '"error"' not in output, where
    return output


def _the_story_holds(steps: list[Snippet], outputs: list[str], work: Path) -> None:
    """What the page says its steps show."""

    def output(start: str, nth: int = 0) -> str:
        """What the `nth` snippet starting with `start` printed."""
        return [o for s, o in zip(steps, outputs, strict=True) if s.text.startswith(start)][nth]

    assert (work / "crossbar.toml").exists()
    assert "config crossbar.toml: ok" in output("crossbar check")
    first_curl, last_curl = output("curl", 0), output("curl", 1)
    assert re.search(r"(?im)^x-crossbar-host: gpu1\r?$", first_curl), first_curl
    assert re.search(r"(?im)^x-crossbar-lease: new\r?$", first_curl), first_curl

    turns = [line.split() for line in output("from openai").splitlines()]
    assert [t[1] for t in turns] == ["new", "reused", "reused"], turns
    assert {t[0] for t in turns} == {"gpu2"}, turns  # gpu1 holds the curl conversation
    assert all(int(t[2]) > 0 for t in turns[1:]), turns  # each later turn read from the cache

    assert output("import anthropic").startswith("qwen-coder "), output("import anthropic")
    evacuated = output("crossbar ctl evacuate")
    moved = re.search(r"gpu1 evacuated: (\d+) of (\d+) conversations moved \((\d+) ", evacuated)
    assert moved and moved[1] == moved[2] == moved[3] == "2", evacuated  # curl's, Anthropic's
    assert re.search(r"(?im)^x-crossbar-host: gpu2\r?$", last_curl), last_curl
    assert re.search(r"(?im)^x-crossbar-lease: reused\r?$", last_curl), last_curl
    cached = re.search(r'"cached_tokens":\s*(\d+)', last_curl)
    assert cached and int(cached[1]) > 0, last_curl  # prewarmed on gpu2 before the move
