"""The real coding agents of tests/agents/: where install.sh put them and how each is run.

Each runs one non-interactive task against a crossbar route, with its telemetry and update
checks off. The task asks for a file to be read, and its last line scripts the fake
llama-server's reply (faketools.py): a call of the agent's own read tool, so a session makes
at least two requests, the second carrying the tool's result after the first one's prompt.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable

from attrs import frozen

from tests.support.harness import MODEL

CACHE = pathlib.Path(os.environ.get("AGENTS_CACHE", pathlib.Path.home() / ".cache/crossbar-agents"))
BIN = CACHE / "node_modules/.bin"
NOTE = "first word: parsers"  # notes.txt; a later request carries it as the tool's result
ASK = "Read notes.txt and tell me its first word."
QUIET = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "NO_COLOR": "1",
}
Command = tuple[list[str], dict[str, str]]


@frozen
class Agent:
    """One agent: its executable, the part of the cache it needs, and its command for a task
    in `work` against a route's base URL (`http://host:port/r/<route>`)."""

    name: str
    exe: pathlib.Path
    part: str  # the install step (npm, aider) whose failure note says why it is missing
    command: Callable[[pathlib.Path, str], Command]

    def missing(self) -> str | None:
        """Why this agent cannot run here, or None."""
        if self.exe.exists():
            return None
        note = CACHE / f"{self.part}.missing"
        why = note.read_text().strip() if note.exists() else "tests/agents/install.sh not run"
        return f"{self.name} is not installed in {CACHE}: {why}"


def _claude(work: pathlib.Path, base: str) -> Command:
    task = f"{ASK}\nCALL Read " + json.dumps({"file_path": str(work / "notes.txt")})
    env = {"ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": "none"}
    env["ANTHROPIC_SMALL_FAST_MODEL"] = MODEL
    return [str(BIN / "claude"), "-p", task, "--model", MODEL], env


def _codex(work: pathlib.Path, base: str) -> Command:
    home = work.parent / "codex-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "crossbar"\n'
        "[model_providers.crossbar]\n"
        f'name = "crossbar"\nbase_url = "{base}/v1"\nenv_key = "CROSSBAR_API_KEY"\n'
        'wire_api = "responses"\n'
    )
    task = f"{ASK}\nCALL exec_command " + json.dumps({"cmd": "cat notes.txt"})
    argv = [str(BIN / "codex"), "exec", "--skip-git-repo-check", task]
    return argv, {"CODEX_HOME": str(home), "CROSSBAR_API_KEY": "none"}


def _opencode(work: pathlib.Path, base: str) -> Command:
    model = {"name": "Qwen Coder (crossbar)", "limit": {"context": 32768, "output": 8192}}
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "crossbar",
        "options": {"baseURL": f"{base}/v1", "apiKey": "{env:CROSSBAR_API_KEY}"},
        "models": {MODEL: model},
    }
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"crossbar": provider},
        "model": f"crossbar/{MODEL}",
        "autoupdate": False,
        "share": "disabled",
    }
    (work / "opencode.json").write_text(json.dumps(config, indent=2))
    task = f"{ASK}\nCALL read " + json.dumps({"filePath": str(work / "notes.txt")})
    # OpenCode installs the provider's npm package on first use: keep it with the agents.
    env = {"CROSSBAR_API_KEY": "none", "XDG_CACHE_HOME": str(CACHE / "opencode-cache")}
    return [str(BIN / "opencode"), "run", task], env


def _aider(work: pathlib.Path, base: str) -> Command:
    argv = [str(CACHE / "aider/bin/aider"), "--openai-api-base", f"{base}/v1"]
    argv += ["--openai-api-key", "none", "--model", f"openai/{MODEL}"]
    argv += ["--message", ASK, "--no-git", "--yes-always", "--no-check-update"]
    argv += ["--analytics-disable", "--no-show-model-warnings", "--no-pretty", "notes.txt"]
    return argv, {}


AGENTS = {
    "claude": Agent("Claude Code", BIN / "claude", "npm", _claude),
    "codex": Agent("Codex CLI", BIN / "codex", "npm", _codex),
    "opencode": Agent("OpenCode", BIN / "opencode", "npm", _opencode),
    "aider": Agent("aider", CACHE / "aider/bin/aider", "aider", _aider),
}
