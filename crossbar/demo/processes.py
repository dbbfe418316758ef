"""Starting and stopping the demo's processes: fake llama-servers, and crossbar under twistd.

Each process runs in a session of its own (so `make demo` can return and leave it running, and
a Ctrl-C meant for the driver does not hit it half-way), writes its output to `<dir>/<name>.log`
and, when started for the demo, leaves its pid in `<dir>/<name>.pid` for `stop`. Only pids
recorded there are ever signalled, and only while their command line still names crossbar.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from crossbar.demo.plan import DemoError

POLL = 0.1  # seconds between looks at a log file or a stopping process


def command(name: str) -> str:
    """A console script installed next to this Python (the venv's bin/)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise DemoError(f"{path} is missing: run `make venv` first (or use `make demo`)")
    return str(path)


@dataclass
class Process:
    """A process the demo started (`popen` set) or found in a pid file (`popen` None)."""

    name: str
    pid: int
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    pidfile: Path | None = None

    def running(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return alive(self.pid)

    def log_tail(self, lines: int = 15) -> str:
        """The end of the process's output, indented, for an error report."""
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "    (no log)"
        tail = text.splitlines()[-lines:] or ["(empty)"]
        return "\n".join(f"    {line}" for line in tail)


@dataclass
class Processes:
    """The processes of one demo or smoke run, stopped together."""

    directory: Path
    record_pids: bool
    started: list[Process] = field(default_factory=list)

    def start(self, name: str, argv: list[str]) -> Process:
        """Start `argv` with its output in `<directory>/<name>.log`."""
        log = self.directory / f"{name}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        process = Process(name, popen.pid, log, popen)
        if self.record_pids:
            process.pidfile = self.directory / f"{name}.pid"
            process.pidfile.write_text(f"{popen.pid}\n")
        self.started.append(process)
        return process

    def stop(self, timeout: float = 10.0) -> list[str]:
        """Stop every started process (crossbar first, as started last); lines saying how."""
        return stop(list(reversed(self.started)), timeout)


def wait_for_line(process: Process, pattern: str, deadline: float) -> re.Match[str]:
    """Wait until the process's log has a line matching `pattern`; DemoError if it exits or
    `deadline` (a time.monotonic() value) passes first."""
    regex = re.compile(pattern)
    while True:
        try:
            text = process.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        found = regex.search(text)
        if found:
            return found
        if not process.running():
            raise DemoError(f"{process.name} exited at start; its log:\n{process.log_tail()}")
        if time.monotonic() > deadline:
            raise DemoError(f"{process.name} did not start in time; its log:\n{process.log_tail()}")
        time.sleep(POLL)


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie nobody has reaped yet counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (macOS): kill(0) is all we know
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        pass
    try:
        out = subprocess.run(["ps", "-p", str(pid), "-o", "command="], capture_output=True)
    except OSError:
        return ""
    return out.stdout.decode(errors="replace")


def recorded(directory: Path) -> list[Process]:
    """The processes whose pid files are in `directory` and that still run crossbar code.

    Pid files of processes that are gone (or whose pid now belongs to something else) are
    removed."""
    found = []
    for pidfile in sorted(directory.glob("*.pid")):
        name = pidfile.stem
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            pidfile.unlink(missing_ok=True)
            continue
        if alive(pid) and "crossbar" in _command_line(pid):
            found.append(Process(name, pid, directory / f"{name}.log", pidfile=pidfile))
        else:
            pidfile.unlink(missing_ok=True)
    # crossbar first, so it does not watch its hosts vanish
    return sorted(found, key=lambda p: p.name != "crossbar")


def stop(processes: list[Process], timeout: float = 10.0) -> list[str]:
    """SIGTERM each, wait up to `timeout` for all, SIGKILL the rest; lines saying what
    happened. Pid files are removed."""
    lines = []
    for process in processes:
        if process.running():
            _signal(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(p.running() for p in processes) and time.monotonic() < deadline:
        time.sleep(POLL)
    for process in processes:
        how = "stopped"
        if process.running():
            _signal(process.pid, signal.SIGKILL)
            how = f"killed (still running {timeout:g}s after SIGTERM)"
            if process.popen is not None:
                process.popen.wait(5)
        lines.append(f"{process.name} (pid {process.pid}) {how}")
        if process.pidfile is not None:
            process.pidfile.unlink(missing_ok=True)
    return lines


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
