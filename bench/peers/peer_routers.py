"""Peer routers to compare crossbar with: SGLang's gateway (smg) and vllm-router, each
installed from PyPI into a venv of its own and launched in front of llama-servers.

    from bench.peers.peer_routers import PeerUnavailable, ensure_installed, launch, wait_ready

    try:
        ensure_installed("smg")            # ~/.cache/crossbar-peers/smg, made on first use
    except PeerUnavailable as e:
        print(f"skipping smg: {e}")
    process = launch(processes, "smg", 21500, urls, "cache_aware", prometheus_port=21501)
    await wait_ready(reactor, process, "http://127.0.0.1:21500", len(urls))

Run as a script it installs the routers (or says why it could not) and prints where:

    .venv/bin/python bench/peers/peer_routers.py [smg] [vllm-router]

CROSSBAR_PEERS overrides the directory (~/.cache/crossbar-peers). Both routers are Rust
binaries inside a Python wheel; each runs in the process that `launch` starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from bench.common.measure import wait_http
from crossbar.demo.processes import Process, Processes

HOME = Path(os.environ.get("CROSSBAR_PEERS", Path.home() / ".cache" / "crossbar-peers"))
INSTALL_SECONDS = 900  # pip's downloads on a slow day
READY_SECONDS = 60.0  # both accept live llama-servers within a second or two


class PeerUnavailable(Exception):
    """A peer router that is not installed and could not be; the message says why."""


@dataclass(frozen=True)
class Peer:
    """How to install and start one router."""

    requirement: str
    script: str  # the console script in the venv's bin/
    subcommand: tuple[str, ...]
    log_level: str  # each spells "warn" its own way (vllm-router refuses "warn")
    policies: tuple[str, ...]


PEERS = {
    "smg": Peer("smg==1.13.0", "smg", ("launch",), "warn", ("cache_aware",)),
    "vllm-router": Peer(
        "vllm-router==0.1.17",
        "vllm-router",
        (),
        "warning",
        # consistent_hash hashes X-Session-ID (else the body, so each turn moves); round_robin
        # is bench/real/real_models.py's baseline
        ("cache_aware", "consistent_hash", "round_robin"),
    ),
}


def _peer(name: str) -> Peer:
    if name not in PEERS:
        raise PeerUnavailable(f"unknown peer router {name!r} (known: {', '.join(PEERS)})")
    return PEERS[name]


def ensure_installed(name: str, home: Path = HOME) -> Path:
    """The router's console script, installing it into `home/name` first if that venv lacks
    it (or holds another version). PeerUnavailable, with the end of pip's log, on failure."""
    peer = _peer(name)
    venv = home / name
    script, stamp = venv / "bin" / peer.script, venv / ".installed"
    if script.exists() and stamp.exists() and stamp.read_text().strip() == peer.requirement:
        return script
    home.mkdir(parents=True, exist_ok=True)
    log = home / f"{name}.install.log"
    print(f"installing {peer.requirement} into {venv} (log {log})", file=sys.stderr, flush=True)
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", peer.requirement],
    ]
    with open(log, "w") as out:
        for argv in steps:
            try:
                done = subprocess.run(
                    argv, stdout=out, stderr=subprocess.STDOUT, timeout=INSTALL_SECONDS
                )
            except (OSError, subprocess.TimeoutExpired) as e:
                raise PeerUnavailable(f"{' '.join(argv[:4])}: {e}") from None
            if done.returncode != 0:
                out.flush()
                raise PeerUnavailable(f"`{' '.join(argv)}` failed:\n{_tail(log)}")
    if not script.exists():
        raise PeerUnavailable(f"{peer.requirement} installed no {script}")
    stamp.write_text(peer.requirement + "\n")
    return script


def available(names: list[str], home: Path = HOME) -> dict[str, Path]:
    """The routers of `names` that are (or could now be) installed; each one that cannot is
    said on stderr with the reason and left out."""
    found = {}
    for name in names:
        try:
            found[name] = ensure_installed(name, home)
        except PeerUnavailable as e:
            print(f"skipping {name}: {e}", file=sys.stderr, flush=True)
    return found


def install_all(names: list[str], out: TextIO, home: Path = HOME) -> dict[str, str]:
    """Install the routers of `names` where they are not; those that cannot be, with why (each
    said on `out`), for a sitting to skip."""
    skipped = {}
    for name in names:
        try:
            ensure_installed(name, home)
        except PeerUnavailable as e:
            skipped[name] = str(e)
            print(f"skipping {name}: {e}", file=out, flush=True)
    return skipped


def command(
    name: str,
    script: Path,
    port: int,
    worker_urls: list[str],
    policy: str = "cache_aware",
    prometheus_port: int | None = None,
    host: str = "127.0.0.1",
) -> list[str]:
    """The command line that starts router `name` on `host:port` over `worker_urls`."""
    peer = _peer(name)
    if policy not in peer.policies:
        raise PeerUnavailable(f"{name} is run here with --policy {'/'.join(peer.policies)} only")
    argv = [str(script), *peer.subcommand, "--host", host, "--port", str(port)]
    argv += ["--worker-urls", *worker_urls, "--policy", policy]
    if prometheus_port is not None:
        # Each serves metrics on 29000 by default; two at once (or a sitting's leftovers)
        # would clash, so every launch names its own.
        argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(prometheus_port)]
    return [*argv, "--log-level", peer.log_level]


def launch(
    processes: Processes,
    name: str,
    port: int,
    worker_urls: list[str],
    policy: str = "cache_aware",
    prometheus_port: int | None = None,
    host: str = "127.0.0.1",
    label: str | None = None,
) -> Process:
    """Start router `name` (installed first if need be) as one of `processes`, its output in
    `<directory>/<label or name>.log`. Not ready yet: `await wait_ready(...)` before sending
    work."""
    script = ensure_installed(name)
    argv = command(name, script, port, worker_urls, policy, prometheus_port, host)
    return processes.start(label or name, argv)


async def wait_ready(
    reactor: Any, process: Process, url: str, workers: int, seconds: float = READY_SECONDS
) -> None:
    """Wait until the router at `url` counts `workers` healthy workers of `workers` on GET
    /readiness (both routers answer `{"healthy_workers": n, "total_workers": m}`): only then
    has it accepted every one, and a request sent earlier may be refused or all land on the
    first. DemoError if the router exits or takes longer than `seconds`."""

    def ready(status: int, body: bytes) -> bool:
        if status != 200:
            return False
        state = json.loads(body)
        return state.get("healthy_workers") == state.get("total_workers") == workers

    what = f"accept {workers} workers"
    await wait_http(reactor, process, f"{url}/readiness", ready, seconds, what)


def _tail(log: Path, lines: int = 15) -> str:
    text = log.read_text(errors="replace").splitlines()
    # pip's warnings about the machine's extra index directories say nothing about the failure
    useful = [line for line in text if not line.startswith("WARNING: Location")]
    return "\n".join(f"    {line}" for line in useful[-lines:])


def main(argv: list[str] | None = None) -> int:
    """Install the named routers (all by default); 1 if any could not be."""
    names = (sys.argv[1:] if argv is None else argv) or list(PEERS)
    found = available(names)
    for name, script in found.items():
        print(f"{name}: {script}")
    return 0 if len(found) == len(names) else 1


if __name__ == "__main__":
    sys.exit(main())
