"""The admin side never stalls the data path: with 100,000 leases, a client fetching every
admin endpoint the dashboard uses, back to back, leaves the proxy's latency alone (loosely: the
numbers are bench/fleet/admin_load.py's, recorded in docs/performance.md)."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fleet" / "admin_load.py"


def test_the_dashboard_s_requests_at_100k_leases_do_not_stall_proxy_requests():
    command = [sys.executable, str(BENCH), "--leases", "100000", "--usage-rows", "20000"]
    done = subprocess.run(
        [*command, "--duration", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    alone, paced, loaded = report["alone"], report["dashboard"], report["back_to_back"]
    assert alone["errors"] == paced["errors"] == loaded["errors"] == 0
    assert paced["admin"]["refreshes"] >= 1 and loaded["admin"]["refreshes"] >= 1
    assert loaded["admin"]["requests"] >= 12  # at least one whole dashboard refresh ran
    # Loose, for a busy machine: a page built on the reactor thread would add seconds (a
    # whole 100,000-lease answer took several); a page now reads a route or two.
    assert loaded["p99_ms"] < alone["p99_ms"] + 500, report
    assert loaded["requests"] > alone["requests"] / 3, report
