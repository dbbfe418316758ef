"""Bringing the demo up: a fake llama-server per host, then crossbar, then a wait for it."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from pathlib import Path

from crossbar.demo.chat import call
from crossbar.demo.plan import DemoError, Plan
from crossbar.demo.processes import POLL, Process, Processes, command, wait_for_line

START_SECONDS = 30.0  # longest wait for a fake or crossbar to come up


@dataclass(frozen=True)
class Knobs:
    """How the fakes behave: slow enough that a prompt-cache hit shows in the timings."""

    tokens_per_second: float = 40.0
    prefill_ms_per_token: float = 3.0


def port_in_use(port: int) -> bool:
    """True when something accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def free_ports(n: int) -> list[int]:
    """`n` distinct ports that were free a moment ago (the kernel's pick for port 0)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def check_ports_free(plan: Plan) -> None:
    """DemoError naming every port of the plan that something already listens on."""
    wanted = [(h.name, h.port) for h in plan.hosts]
    wanted += [("crossbar", plan.listen_port), ("crossbar admin", plan.admin_port)]
    busy = [f"{port} ({who})" for who, port in wanted if port_in_use(port)]
    if busy:
        raise DemoError(
            f"port(s) already in use on 127.0.0.1: {', '.join(busy)}. Another crossbar or "
            f"fake? Stop it (`make demo-stop` stops a demo) or change the ports in {plan.path}"
        )


def start_fakes(
    processes: Processes, plan: Plan, knobs: Knobs, any_port: bool = False
) -> dict[str, str]:
    """One `crossbar-fakellama` per configured host; returns host name -> URL once all listen.

    `any_port`: let each fake pick a free port (the smoke run) instead of the configured one."""
    fake = command("crossbar-fakellama")
    started: list[tuple[str, Process]] = []
    for host in plan.hosts:
        argv = [fake, "--port", "0" if any_port else str(host.port)]
        for model in host.models:
            argv += ["--model", model]
        argv += ["--parallel", str(host.parallel), "--ctx", str(host.ctx)]
        argv += ["--tokens-per-second", f"{knobs.tokens_per_second:g}"]
        argv += ["--prefill-ms-per-token", f"{knobs.prefill_ms_per_token:g}"]
        started.append((host.name, processes.start(host.name, argv)))
    deadline = time.monotonic() + START_SECONDS
    return {
        name: wait_for_line(process, r" at (http://\S+)", deadline).group(1)
        for name, process in started
    }


def start_crossbar(processes: Processes, config: Path) -> Process:
    """crossbar under twistd, in the foreground of its own process, logging to crossbar.log."""
    twistd = command("twistd")
    return processes.start("crossbar", [twistd, "-n", "--pidfile=", "crossbar", "-c", str(config)])


def wait_ready(plan: Plan, crossbar: Process) -> None:
    """Poll the route's /health until crossbar answers 200; DemoError if it exits or is slow."""
    url = plan.route_url("/health")
    deadline = time.monotonic() + START_SECONDS
    last = "no answer yet"
    while True:
        try:
            answer = call("GET", url)
            if answer.status == 200:
                return
            last = f"HTTP {answer.status}: {answer.body.decode(errors='replace')[:200]}"
        except OSError as e:
            last = str(e)
        if not crossbar.running():
            raise DemoError(f"crossbar exited at start; its log:\n{crossbar.log_tail()}")
        if time.monotonic() > deadline:
            raise DemoError(
                f"crossbar did not answer {url} within {START_SECONDS:g}s (last: {last}); "
                f"its log:\n{crossbar.log_tail()}"
            )
        time.sleep(POLL)
