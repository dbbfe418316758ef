"""Claude Code through crossbar in front of two real llama-servers, with crossbar's defaults.

The issue's hosts: a 32768-token slot each (`-c 32768 -np 1`), and crossbar's default config,
whose guard once refused every Claude Code request. Gemma 3 270M never ends a reply on its own
and llama-server lets a request's `max_tokens` override its `-n` (server-context.cpp:
`task.params.n_predict != -1 ? task.params.n_predict : params_base.n_predict`), so Claude Code's
default 32000 would mean half an hour of rambling per turn on one CPU thread: the session caps
its replies with Claude Code's own CLAUDE_CODE_MAX_OUTPUT_TOKENS (the 32000-token request on a
32k slot is served in tests/proxy/test_guard_served.py). A reply cut at the cap ends with
`max_tokens`, and Claude Code asks to go on (three times at most), each time with the whole
conversation again, which is what the prompt cache is for: every request of the session on one
host, and each after the first read at least 90% from that host's cache. The session succeeds
when Claude Code exits 0, or gives up on a model that never stops with its own "exceeded the
output token maximum" (the model's doing, not crossbar's).
"""

import pytest
import pytest_twisted

from tests.agents.agents import AGENTS, NOTE
from tests.agents.stage import run_agent
from tests.real.llamas import IN_CI

SLOT = 32_768


@pytest_twisted.ensureDeferred
async def test_a_claude_code_session_runs_on_one_host_from_its_cache(launch, tmp_path, monkeypatch):
    claude = AGENTS["claude"]
    if (why := claude.missing()) is not None:
        if IN_CI:
            pytest.fail(f"CI=true and {why}", pytrace=False)
        pytest.skip(why)
    monkeypatch.setenv("CLAUDE_CODE_MAX_OUTPUT_TOKENS", "100")
    crossbar, _ = await launch(ctx=SLOT, parallel=1)
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
