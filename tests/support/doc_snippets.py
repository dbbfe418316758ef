"""The shell and Python snippets of README.md and docs/, found as a reader finds them.

A snippet is an indented code block. It is Python when it parses as Python and imports
something (a Python snippet must run as pasted, so it starts from its imports), shell when its
first command is one a reader would type (`crossbar`, `curl`, `make`, ...); anything else
(config files, JSON, output, JavaScript) is not run, nor is a benchmark (`python bench/...`). The line before a snippet (blank lines
aside) may say why it is not run here:

    <!-- snippet: not run: <why> -->
    <!-- snippet: real llama-server -->   (needs one; tests/real/ covers what it shows)
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from attrs import frozen

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_COMMANDS = {
    *("crossbar", "curl", "make", "twistd", "export", "systemctl", "useradd", "sudo", "cd"),
    *("apt-get", "pip", "python", "python3", "systemd-analyze", "journalctl", "jq"),
    *("claude", "codex", "opencode", "aider", "npm", "crossbar-fakellama", "llama-server"),
}
_MARKER = re.compile(r"^<!-- snippet: (not run: (?P<why>.+)|(?P<real>real llama-server)) -->$")
_LIST_ITEM = re.compile(r"^\s*([-*]|\d+\.)\s")


@frozen
class Snippet:
    """One code block: where it is, its text, what it is and whether the doc says skip."""

    path: Path
    line: int
    text: str
    kind: str  # "python", "shell", "bench" (a benchmark command: not run) or "other"
    skip: str  # "" to run; else why not

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _blocks(lines: list[str]) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of each indented code block (not list continuations)."""
    blocks: list[tuple[int, list[str]]] = []
    current: list[str] = []
    start = 0
    in_list = False
    for number, line in enumerate([*lines, ""], 1):
        if line.startswith("    ") and (current or (number > 1 and not lines[number - 2].strip())):
            if not current:
                if in_list:
                    continue
                start = number
            current.append(line[4:])
            continue
        if not line.strip():
            if current:
                current.append("")
            continue
        if current:
            blocks.append((start, current))
            current = []
        in_list = bool(_LIST_ITEM.match(line)) or (in_list and line.startswith(" "))
    return blocks


def _kind(text: str) -> str:
    first = next((ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")), "")
    try:
        tree = ast.parse(text)
    except SyntaxError:
        tree = None
    if tree is not None and any(isinstance(n, ast.Import | ast.ImportFrom) for n in tree.body):
        return "python"
    words = first.split()
    word = words[0] if words else ""
    if word.endswith("python") and len(words) > 1 and words[1].startswith("bench/"):
        return "bench"  # minutes of CPU; docs/performance.md holds what it printed
    if word in SHELL_COMMANDS or word.startswith(".venv/bin/"):
        return "shell"
    return "other"


def _marker(lines: list[str], start: int) -> str:
    for line in reversed(lines[: start - 1]):
        if line.strip():
            found = _MARKER.match(line.strip())
            if found is None:
                return ""
            return found.group("why") or "needs a real llama-server"
    return ""


def snippets() -> list[Snippet]:
    """Every code block of README.md and docs/*.md, in reading order."""
    found = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        for start, block in _blocks(lines):
            text = "\n".join(block).strip("\n") + "\n"
            found.append(Snippet(path, start, text, _kind(text), _marker(lines, start)))
    return found
