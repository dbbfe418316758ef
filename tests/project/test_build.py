"""The build: which of the request path's modules run compiled, the pure fallback, and no stale
extension module shadowing newer source."""

import os
import subprocess
import sys
from importlib import import_module
from pathlib import Path

from crossbar import build


def _in_child(code: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_the_build_line_names_the_compiled_modules_that_run_as_extension_modules():
    compiled = build.extension_modules()
    assert set(compiled) <= set(build.COMPILED)
    if compiled:
        assert (
            build.describe()
            == f"compiled (mypyc, {len(compiled)} of {len(build.COMPILED)} modules)"
        )
    else:
        assert build.describe().startswith("pure Python")


def test_crossbar_pure_imports_the_source_even_where_the_extension_modules_exist():
    files = _in_child(
        "import importlib, crossbar.build as b\n"
        "print(' '.join(importlib.import_module(m).__file__ for m in b.COMPILED))\n"
        "print(b.describe())",
        CROSSBAR_PURE="1",
    ).splitlines()
    assert all(f.endswith(".py") for f in files[0].split())
    assert files[1] == "pure Python (CROSSBAR_PURE set)"


def test_no_compiled_module_is_older_than_its_source():
    # A stale .so would run old code in place of the source: `make venv` rebuilds it.
    for name in build.extension_modules():
        so = Path(import_module(name).__file__ or "")
        source = so.parent / (name.rpartition(".")[2] + ".py")
        assert so.stat().st_mtime >= source.stat().st_mtime, f"{so} is older than {source}"
