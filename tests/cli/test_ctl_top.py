"""`crossbar ctl top`, driven in a pseudo-terminal against a running crossbar: it shows hosts'
slots and queues, requests per second and cache hits per route, the latest moves, refreshes
by itself, and `q` quits with the terminal put back as it was."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import pathlib
import re
import select
import struct
import subprocess
import sys
import termios

import pytest_twisted
from twisted.internet.threads import deferToThread

from crossbar.cli.main import main
from crossbar.cli.top import Snapshot, frame, moves
from tests.support.admin_harness import conversation, start_service, write_config
from tests.support.harness import MODEL, start_fakes, turn, wait

COMMAND = str(pathlib.Path(sys.executable).parent / "crossbar")
HOME = "\x1b[H\x1b[2J"


def event(at, reason, fp, model, src, dst):
    return {"at": at, "reason": reason, "route": "convo", "fp": fp, "model": model,
            "from_host": src, "to_host": dst}  # fmt: skip


def test_recent_moves_are_conversations_changing_host_newest_first():
    events = [
        event(9.0, "pin", "", "", "", "atlas"),  # the pin itself
        event(8.0, "pin", "f1", MODEL, "titan", "atlas"),
        event(7.0, "new", "f2", MODEL, "", "titan"),
        event(6.0, "unhealthy", "f3", MODEL, "atlas", "titan"),
        event(5.0, "idle", "f4", MODEL, "titan", ""),
    ]
    assert [e["fp"] for e in moves(events)] == ["f1", "f3"]


def test_a_frame_says_what_failed_when_crossbar_cannot_be_read():
    snap = Snapshot(None, [], [], [], "cannot reach crossbar's admin API at http://x: refused")
    lines = frame(snap, "http://x", 0.0, 60)
    assert "cannot reach crossbar's admin API at http://x: refused" in lines
    assert "(trying again at the next refresh)" in lines


def test_a_hosts_row_shows_slots_held_per_class_and_waiters_after_a_plus():
    classes = {"interactive": {"in_flight": 1, "queued": 0},
               "standard": {"in_flight": 0, "queued": 2},
               "batch": {"in_flight": 3, "queued": 9}}  # fmt: skip
    host = {"name": "titan", "healthy": True, "draining": False, "models": [
        {"name": MODEL, "in_flight": 4, "parallel": 4, "queued": 11, "leases": 5, "state": None,
         "classes": classes}]}  # fmt: skip
    lines = frame(Snapshot({}, [host], [], []), "http://x", 0.0, 60)
    row = next(line for line in lines if line.startswith("titan"))
    assert row.split()[:9] == ["titan", "healthy", MODEL, "-", "4/4", "11", "1/0/3", "+0/2/9",
                               "5"]  # fmt: skip


class Terminal:
    """A pseudo-terminal of 140 x 40 with `crossbar ctl top` in it."""

    def __init__(self, admin: str) -> None:
        self.master, self.slave = os.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 140, 0, 0))
        self.before = termios.tcgetattr(self.slave)
        env = {**os.environ, "TERM": "xterm"}
        argv = [COMMAND, "ctl", "--admin", admin, "top", "--interval", "0.2", "--window", "600"]
        self.process = subprocess.Popen(
            argv, stdin=self.slave, stdout=self.slave, stderr=self.slave, env=env,
            start_new_session=True,
        )  # fmt: skip
        self.text = ""

    def screen(self) -> str:
        """The last frame drawn."""
        return self.text.rsplit(HOME, 1)[-1]

    def until(self, predicate, deadline: float = 60.0) -> str:
        """Read what top writes until the last full frame satisfies `predicate` (runs in a
        thread; the deadline is generous, it only bounds a hang)."""
        waited = 0.0
        while waited < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            waited += 0.1
            if ready:
                try:
                    self.text += os.read(self.master, 65536).decode("utf-8", "replace")
                except OSError:
                    break  # the child closed the terminal
            frames = self.text.split(HOME)
            # The frame before the last one is surely complete.
            if len(frames) > 2 and predicate(frames[-2]):
                return frames[-2]
        raise AssertionError(f"top never showed it; its last frame:\n{self.screen()}")

    def rest(self) -> str:
        """What the child wrote before it exited (call once it has)."""
        while select.select([self.master], [], [], 1.0)[0]:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                break
            if not data:
                break
            self.text += data.decode("utf-8", "replace")
        return self.text

    def press(self, key: bytes) -> None:
        os.write(self.master, key)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        os.close(self.master)
        os.close(self.slave)


def row(screen: str, first: str) -> list[str]:
    """The cells of the screen's line that starts with `first`."""
    for line in screen.replace("\r", "").splitlines():
        if line.split()[:1] == [first]:
            return line.split()
    raise AssertionError(f"no line starts with {first!r}:\n{screen}")


@pytest_twisted.ensureDeferred
async def test_top_shows_slots_traffic_and_moves_refreshes_and_quits_on_q(tmp_path):
    fakes = await start_fakes("titan", "atlas")
    routes = {"convo": {"hosts": ["titan", "atlas"], "default_model": MODEL}}
    running = await start_service(write_config(tmp_path / "c.toml", fakes, routes), fakes)
    terminal = None
    try:
        for name in ("a", "b"):  # one conversation on each host, two turns each
            history = conversation(name)
            _, reply = await running.chat("convo", history)
            await running.chat("convo", turn(history, reply, "and the tests"))
        assert (await running.call("PUT", "/api/routes/convo/pin", {"host": "atlas"}))[0] == 200
        await running.chat("convo", conversation("a"))  # titan's conversation moves to atlas
        terminal = Terminal(running.admin_url)
        screen = await wait(deferToThread(terminal.until, lambda s: "-> atlas" in s), 90)
        # Slots, queued, held per class (interactive/standard/batch), leases.
        assert row(screen, "titan")[:8] == ["titan", "healthy", MODEL, "-", "0/2", "0", "0/0/0",
                                            "0"]  # fmt: skip
        assert row(screen, "atlas")[:8] == ["atlas", "healthy", MODEL, "-", "0/2", "0", "0/0/0",
                                            "2"]  # fmt: skip
        convo = row(screen, "convo")
        assert convo[2:4] == ["5", "0"]  # requests, errors in the window
        assert float(convo[1]) > 0 and float(convo[4].rstrip("%")) > 0  # req/s, cache hits
        assert re.search(r"\bpin\s+convo\s+\w+\s+" + MODEL + r"\s+titan -> atlas", screen)

        await running.call("POST", "/api/hosts/titan/drain")
        screen = await wait(deferToThread(terminal.until, lambda s: "draining" in s), 90)
        assert row(screen, "titan")[:3] == ["titan", "healthy", "draining"]

        terminal.press(b"q")
        assert await wait(deferToThread(terminal.process.wait, 30), 40) == 0
        written = await wait(deferToThread(terminal.rest), 30)
        assert written.endswith("\x1b[?25h\x1b[?1049l")  # cursor and screen back
        assert termios.tcgetattr(terminal.slave) == terminal.before  # cbreak undone
    finally:
        if terminal is not None:
            terminal.close()
        await running.stop()


@pytest_twisted.ensureDeferred
async def test_once_prints_one_plain_frame_for_scripts(tmp_path, serve):
    fakes = await start_fakes("titan")
    routes = {"convo": {"hosts": ["titan"], "default_model": MODEL}}
    running = await serve(write_config(tmp_path / "c.toml", fakes, routes), fakes)
    await running.chat("convo", conversation("a"))

    def once() -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["ctl", "--admin", running.admin_url, "top", "--once"])
        return code, out.getvalue()

    code, text = await wait(deferToThread(once), 30)
    assert code == 0 and "\x1b" not in text
    assert row(text, "titan")[:5] == ["titan", "healthy", MODEL, "-", "0/2"]
    assert row(text, "convo")[2] == "1" and "recent moves: none" in text
