"""The installed environment exposes crossbar to twistd and as console commands."""

import pathlib
import shutil
import subprocess
import sys

from twisted.application.service import IServiceMaker
from twisted.plugin import getPlugins

from twisted.plugins import crossbar_plugin  # noqa: F401 - the import itself is the check


def test_twistd_finds_the_crossbar_plugin():
    assert "crossbar" in {p.tapname for p in getPlugins(IServiceMaker)}


def test_twistd_help_lists_crossbar_from_any_directory(tmp_path):
    out = subprocess.run(
        [str(pathlib.Path(sys.executable).parent / "twistd"), "--help"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,  # not the repo: the installed environment must carry the plugin
    )
    assert "crossbar" in out.stdout


def test_console_scripts_are_installed():
    assert shutil.which("crossbar", path=str(pathlib.Path(sys.executable).parent))
