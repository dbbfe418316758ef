"""Claude Code through crossbar in front of two real llama-servers, with crossbar's defaults.

The issue's hosts: a 32768-token slot each (`-c 32768 -np 1`). Claude Code asks for 32000 reply
tokens on a prompt of about 4k: crossbar passes that through (the guard weighs the prompt
alone). The servers stop a reply after 200 tokens (`-n 200`, so the small model's rambling
costs seconds, not an hour); a reply cut there ends with `max_tokens`, and Claude Code asks to
go on (three times at most), each time with the whole conversation again, which is what the
prompt cache is for: every request of the session on one host, and each after the first read
at least 90% from that host's cache. The session succeeds when Claude Code exits 0, or gives
up on a model that never stops with its own "exceeded the output token maximum" (the model's
doing, not crossbar's).
"""

import pytest
import pytest_twisted

from tests.agents.agents import AGENTS, NOTE
from tests.agents.stage import run_agent
from tests.real.llamas import IN_CI

SLOT = 32_768


@pytest_twisted.ensureDeferred
async def test_a_claude_code_session_runs_on_one_host_from_its_cache(launch, tmp_path):
    claude = AGENTS["claude"]
    if (why := claude.missing()) is not None:
        if IN_CI:
            pytest.fail(f"CI=true and {why}", pytrace=False)
        pytest.skip(why)
    crossbar, _ = await launch(ctx=SLOT, parallel=1, llama_args=("-n", "200"))
    rows = []
    crossbar.parts.usage.observers.append(rows.append)
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "notes.txt").write_text(NOTE + "\n")
    code, printed = await run_agent(claude, work, crossbar.url("convo", ""), seconds=240)
    assert code == 0 or "output token maximum" in printed, printed[-3000:]
    assert rows and all(r.status == 200 and not r.error for r in rows), rows
    figures = [(r.prompt_tokens, r.cached_tokens, r.ttfb_ms, r.lease, r.host) for r in rows]
    print(f"\nclaude (real): {figures}")
    assert len({r.host for r in rows}) == 1, figures
    assert crossbar.parts.guard.refused == 0
    for later in rows[1:]:
        assert later.cached_tokens >= 0.9 * later.prompt_tokens, figures
