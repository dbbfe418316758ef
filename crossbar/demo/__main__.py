"""`python -m crossbar.demo run|smoke|stop`: see the package docstring."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import crossbar.demo
from crossbar.demo.chat import conversations, drive
from crossbar.demo.checks import check_endpoints, check_turns
from crossbar.demo.launch import (
    Knobs,
    check_ports_free,
    free_ports,
    port_in_use,
    start_crossbar,
    start_fakes,
    wait_ready,
)
from crossbar.demo.plan import DemoError, Plan, read_plan, rewrite
from crossbar.demo.processes import Processes, recorded, stop


def say(line: str = "") -> None:
    print(line, flush=True)


def _next_steps(plan: Plan, directory: Path) -> None:
    base = plan.route_url("/v1")
    admin = "" if port_in_use(plan.admin_port) else "  (not served by this build yet)"
    names = ["crossbar", *(h.name for h in plan.hosts)]
    logs = ", ".join(str(directory / f"{name}.log") for name in names)
    say()
    say(f"crossbar is running on {plan.base} in front of {', '.join(h.name for h in plan.hosts)}.")
    say("Try it:")
    say(f"  curl -sD - {base}/chat/completions -H 'Content-Type: application/json' \\")
    say('       -d \'{"messages": [{"role": "user", "content": "Hello"}]}\'')
    say(f"  OpenAI client base URL:  {base}   (api_key: anything; this route has no keys)")
    if plan.template_route:
        say(f"  a route from the template: {plan.route_url('/v1', 'proj-alpha')}")
    say(f"  admin API and dashboard: {plan.admin_url}{admin}")
    say(f"  logs: {logs}")
    say("Stop it: make demo-stop")


def run(args: argparse.Namespace) -> int:
    """Start the demo, drive two conversations through it, and leave it running."""
    directory = Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    plan = read_plan(args.config, args.route)
    leftovers = recorded(directory)
    if leftovers:
        say(f"stopping the demo that was running ({', '.join(p.name for p in leftovers)})")
        stop(leftovers)
    check_ports_free(plan)
    if plan.db != ":memory:":
        Path(plan.db).parent.mkdir(parents=True, exist_ok=True)
    processes = Processes(directory, record_pids=True)
    try:
        urls = start_fakes(processes, plan, Knobs())
        for name, url in urls.items():
            say(f"fake llama-server {name} at {url}")
        wait_ready(plan, start_crossbar(processes, plan.path))
        say(f"crossbar at {plan.base} (config {plan.path}, log {directory / 'crossbar.log'})")
        say()
        drive(plan, conversations(), say)
    except BaseException:
        for line in processes.stop():
            say(line)
        raise
    _next_steps(plan, directory)
    return 0


# What a wrong or missing answer from crossbar raises in the driver: a failed check, not a bug.
FAILURES = (DemoError, OSError, ValueError, LookupError, TypeError)


def smoke(args: argparse.Namespace) -> int:
    """The demo on free ports with a temporary db; every wrong answer fails; all stopped."""
    plan = read_plan(args.config, args.route)
    work = Path(tempfile.mkdtemp(prefix="crossbar-smoke-"))
    try:
        problems = _smoke_in(work, plan, args.route)
    except BaseException:  # interrupted: nothing worth keeping
        shutil.rmtree(work, ignore_errors=True)
        raise
    if problems:
        for problem in problems:
            say(f"smoke FAILED: {problem}")
        say(f"smoke: logs and config kept in {work}")
        return 1
    shutil.rmtree(work, ignore_errors=True)
    say("smoke: ok (sticky hosts, cache hits from turn 2, models, 404 for an unknown route)")
    return 0


def _smoke_in(work: Path, plan: Plan, route: str) -> list[str]:
    """Run the smoke with its files in `work`; the problems found. Everything started is
    stopped before this returns or raises."""
    processes = Processes(work, record_pids=False)
    problems: list[str] = []
    try:
        urls = start_fakes(processes, plan, Knobs(), any_port=True)
        listen, admin = free_ports(2)
        config = work / "smoke.toml"
        config.write_text(rewrite(plan, urls, listen, admin, str(work / "crossbar.db")))
        plan = read_plan(config, route)
        wait_ready(plan, start_crossbar(processes, config))
        say(f"smoke: crossbar at {plan.base} in front of {', '.join(urls.values())}")
        turns = drive(plan, conversations(), say)
        problems = check_turns(turns) + check_endpoints(plan)
    except FAILURES as e:
        problems = [str(e) if isinstance(e, DemoError) else f"{type(e).__name__}: {e}"]
    finally:
        processes.stop()
        left = [p for p in processes.started if p.running()]
        problems += [f"{p.name} (pid {p.pid}) is still running after the stop" for p in left]
    return problems


def stop_command(args: argparse.Namespace) -> int:
    """Stop what `run` recorded in the demo directory."""
    directory = Path(args.dir)
    found = recorded(directory) if directory.is_dir() else []
    if not found:
        say(f"nothing to stop: no running demo process recorded in {directory}/")
        return 0
    for line in stop(found):
        say(line)
    return 0


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m crossbar.demo",
        description=crossbar.demo.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["run", "smoke", "stop"])
    parser.add_argument("--config", default="examples/demo.toml", help="the crossbar config")
    parser.add_argument("--dir", default="demo", help="pids and logs of `run` (default: demo)")
    parser.add_argument("--route", default="convo", help="the route the conversations use")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupted)  # clean up as on Ctrl-C
    commands = {"run": run, "smoke": smoke, "stop": stop_command}
    try:
        return commands[args.command](args)
    except FAILURES as e:
        what = str(e) if isinstance(e, DemoError) else f"{type(e).__name__}: {e}"
        print(f"demo: {what}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo: interrupted; what it started is stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
