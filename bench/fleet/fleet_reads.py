"""`bench/fleet/fleet.py reads`: do the admin's reports hold up lease writes? New conversations (a
lease write each) with and without a client fetching /api/routes back to back, on a store with
`--usage-rows` usage rows of the last day (summed per minute as a running sweep leaves them)."""

from __future__ import annotations

import argparse
import sqlite3
import time
from pathlib import Path
from typing import Any

from twisted.internet import defer

from bench.fleet.fleet_store import ms
from crossbar.store.backends import SQLITE
from crossbar.store.rollups import roll_up
from crossbar.store.setup import migrate

FILL = """
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?)
INSERT INTO usage (at, route, fp, model, host, path, status, stream, prompt_tokens,
                   cached_tokens, completion_tokens, ttfb_ms, duration_ms)
SELECT ? - i * ?, 'team-' || (i % 100), printf('%x', i % 50000), ?, 'fake',
       '/v1/chat/completions', 200, 0, 1000, i % 900, 50, 20.0 + i % 300, 400.0
FROM n"""


def fill(db: Path, rows: int, model: str) -> None:
    """`rows` usage rows over the last day, rolled up as the sweep would have."""
    conn = sqlite3.connect(db, isolation_level=None)
    migrate(conn)
    now = time.time()
    conn.execute(FILL, (rows, now, 86400.0 / rows, model))
    conn.execute("COMMIT")
    while not roll_up(conn.cursor(), SQLITE, now, raw_before=now - 48 * 3600).caught_up:
        conn.execute("COMMIT")
    conn.execute("COMMIT")
    conn.close()


async def reads(reactor: Any, args: argparse.Namespace) -> None:
    """New conversations for `--duration` s alone, then beside /api/routes back to back."""
    import fleet  # the parties and clients of the other scenarios

    party = fleet.Party()
    try:
        url, _ = party.fake("fake")
        fill(party.work / "c.db", args.usage_rows, fleet.MODEL)
        party.start({"fake": url}, ["fake"], "5s", 64)
        ag = fleet.agent(reactor, 8)
        admin: list[float] = []
        stop = [False]

        async def conversations(name: str) -> list[float]:
            took: list[float] = []
            end, n = reactor.seconds() + args.duration, 0
            while reactor.seconds() < end:
                status, *_, seconds = await fleet.post_chat(ag, reactor, party, f"{name}{n}")
                assert status == 200, status
                took.append(seconds)
                n += 1
            return took

        async def routes() -> None:
            while not stop[0]:
                *_, seconds = await fleet.call(ag, reactor, b"GET", party.admin + "/api/routes")
                admin.append(seconds)

        alone = await conversations("alone")
        loop = defer.ensureDeferred(routes())
        beside = await conversations("beside")
        stop[0] = True
        await loop
        print(f"{args.usage_rows:,} usage rows of the last day, summed per minute")
        print(f"new conversations alone:             {ms(alone)}")
        print(f"new conversations beside /api/routes: {ms(beside)}")
        print(f"/api/routes back to back: first {admin[0] * 1000:.0f} ms, then {ms(admin[1:])}")
    finally:
        party.stop()
