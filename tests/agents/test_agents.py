"""The real coding agents through crossbar, each on a one-shot task (issue 19).

Claude Code (`claude -p`, Anthropic Messages), Codex CLI (`codex exec`, Responses), OpenCode
(`opencode run`, OpenAI chat) and aider (`aider --message`, OpenAI chat), pinned and installed
by tests/agents/install.sh, against crossbar in front of two fake llama-servers. Each finishes
its task; every request of its session lands on one host; a request after the first reads its
prefix from the host's cache (the tool-using agents: at least 90% of its prompt). The request
shapes each agent sent are kept in fixtures/<agent>.json (CROSSBAR_AGENT_FIXTURES=write to
renew them after changing a pin), and a change shows here. Without an agent its test skips
with the reason, except under CI=true, where it fails.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

import pytest
import pytest_twisted

from tests.agents.agents import AGENTS, NOTE
from tests.agents.stage import shape, start_stage

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
IN_CI = os.environ.get("CI") == "true"
pytestmark = pytest.mark.timeout(300, method="thread")


def needs(name: str) -> None:
    why = AGENTS[name].missing()
    if why is not None:
        if IN_CI:
            pytest.fail(f"CI=true and {why}", pytrace=False)
        pytest.skip(why)


def check_fixture(name: str, shapes: list[dict]) -> None:
    path = FIXTURES / f"{name}.json"
    seen = sorted(shapes, key=lambda s: json.dumps(s, sort_keys=True))
    if os.environ.get("CROSSBAR_AGENT_FIXTURES") == "write" or not path.exists():
        path.write_text(json.dumps(seen, indent=1, sort_keys=True) + "\n")
    assert seen == json.loads(path.read_text()), f"{name} now asks differently: see {path}"


@pytest.mark.parametrize("name", list(AGENTS))
@pytest_twisted.ensureDeferred
async def test_an_agent_finishes_its_task_on_one_host_reading_from_the_cache(name, tmp_path):
    needs(name)
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "home").mkdir()
    (work / "notes.txt").write_text(NOTE + "\n")
    stage = await start_stage()
    try:
        started = time.monotonic()
        code, printed = await stage.run(AGENTS[name], work)
        took = time.monotonic() - started
    finally:
        await stage.stop()
    assert code == 0, printed[-3000:]
    rows = stage.rows
    assert rows and all(r.status == 200 and not r.error for r in rows), rows
    hosts = {r.host for r in rows} | {a["host"] for a in stage.asked}
    assert len(hosts) == 1, hosts  # the whole session on one host, by crossbar and the fakes
    figures = [(r.path, r.prompt_tokens, r.cached_tokens, r.lease) for r in rows]
    print(f"\n{name}: {took:.1f} s, host {hosts.pop()}, (path, prompt, cached, lease): {figures}")
    if name != "aider":  # aider's one-shot is one request: no tool, nothing to come back
        assert any(NOTE in json.dumps(a["body"]) for a in stage.asked[1:])  # the tool ran
        last = rows[-1]
        assert last.cached_tokens >= 0.9 * last.prompt_tokens, figures
    check_fixture(name, [shape(a) for a in stage.asked])
