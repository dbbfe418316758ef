"""Headless Chromium for the browser stories: load a page, let its scripts run, read the DOM."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def render(url: str, profile: Path, screenshot: Path | None = None) -> str:
    """The DOM of `url` after Chromium ran its scripts for a few (virtual) seconds."""
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=5000",
        "--window-size=1280,900",
    ]
    if screenshot is not None:
        command.append(f"--screenshot={screenshot}")
    else:
        command.append("--dump-dom")
    done = subprocess.run([*command, url], capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def element(dom: str, id_: str) -> str:
    """The inner HTML of the element with `id_` (first match, non-nested tag)."""
    match = re.search(rf'<(\w+)[^>]*\bid="{id_}"[^>]*>(.*?)</\1>', dom, re.S)
    assert match, f"no #{id_} in the page"
    return match.group(2)
