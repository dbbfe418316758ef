"""Which build of crossbar runs: the modules on the request path that mypyc compiles (where a
C compiler was present at `make venv`), and whether they are extension modules here.

The same source is always importable as plain Python: the pure build is the fallback and the
reference. `CROSSBAR_PURE=1` in the environment makes this process import the `.py` source of
the compiled set even where the `.so` files exist (`make test-pure`, or an operator ruling a
compiled module out).

Run as a script (`python crossbar/build.py compile`), without importing crossbar, it builds
them in place: what `make venv` does.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

# Each kept because its microbenchmark gained when compiled (docs/performance.md, "The build").
# mypy reads the zope interfaces some are typed with (IReactorTime...) through the mypy-zope
# plugin (pyproject.toml); an attrs class with `field(...)` defaults does not compile (fails at
# import), so a compiled module's own classes are plain slotted ones. Measured and left pure:
# proxy.routing (within the noise: its work is regexes and dict lookups), admin.metrics
# (slower: prometheus_client's calls dominate), leases.table (peek 0.63-0.74 of pure, but the
# compiled coroutines crash the interpreter when a Deferred they await is cancelled:
# tests/leases/test_lease_failures.py, a cancelled acquire). Compiled and measured in a whole
# process, not kept: wire.pool, wire.answer, proxy.request and wire.bodies (the request path's
# glue around Twisted's objects, whose every call stays a Python call: the proxy's CPU per
# request within the noise of the pure build's, docs/performance.md).
COMPILED = (
    "crossbar.wire.headers",
    "crossbar.leases.memory",
    "crossbar.limiter.slots",
    "crossbar.limiter.reserve",
    "crossbar.limiter.fairqueue",
)

PURE_ENV = "CROSSBAR_PURE"


def pure_wanted() -> bool:
    return os.environ.get(PURE_ENV, "") not in ("", "0")


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the `.py` source of a compiled-set module, ahead of its extension module."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in COMPILED or not path:
            return None
        source = os.path.join(path[0], fullname.rpartition(".")[2] + ".py")
        return importlib.util.spec_from_file_location(fullname, source)


def prefer_source() -> None:
    """Import the compiled set from source in this process (before any of it is imported)."""
    if not any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFinder())


def extension_modules() -> list[str]:
    """The modules of the compiled set that run as extension modules in this process."""
    return [
        name
        for name in COMPILED
        if str(getattr(importlib.import_module(name), "__file__", "")).endswith(".so")
    ]


def describe() -> str:
    """One line naming the build: `compiled (mypyc, 5 of 5 modules)` or `pure Python`."""
    compiled = extension_modules()
    if not compiled:
        return "pure Python" + (f" ({PURE_ENV} set)" if pure_wanted() else "")
    return f"compiled (mypyc, {len(compiled)} of {len(COMPILED)} modules)"


# Building (the script side): only the standard library, crossbar not imported.

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sources() -> list[str]:
    return [name.replace(".", "/") + ".py" for name in COMPILED]


def _extensions() -> list[str]:
    """Where the compiled set's extension modules go, next to their source."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return [os.path.join(_ROOT, s[: -len(".py")] + suffix) for s in _sources()]


def _built() -> list[str]:
    """The extension modules a build left in the tree (any under crossbar/, and mypyc's shared
    library at the top), so a module dropped from the set leaves nothing behind."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    found = [os.path.join(_ROOT, n) for n in os.listdir(_ROOT) if n.endswith("__mypyc" + suffix)]
    for folder, _, names in os.walk(os.path.join(_ROOT, "crossbar")):
        found += [os.path.join(folder, n) for n in names if n.endswith(suffix)]
    return found


def _compiler() -> str | None:
    import shutil
    import sysconfig

    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc)


def compile_in_place() -> str:
    """Build the compiled set next to its source; on any failure leave the pure build. Returns
    the line `make venv` prints."""
    import subprocess
    import time

    for path in _built():
        os.remove(path)
    if _compiler() is None:
        return "crossbar build: pure Python (no C compiler)"
    log = os.path.join(_ROOT, "build", "mypyc.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    start = time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run(
            [sys.executable, "-m", "mypyc", *_sources()],
            cwd=_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "MYPYC_OPT_LEVEL": os.environ.get("MYPYC_OPT_LEVEL", "3")},
        )
    took = time.monotonic() - start
    if done.returncode != 0 or not all(os.path.exists(p) for p in _extensions()):
        for path in _built():
            os.remove(path)
        return f"crossbar build: pure Python (the mypyc build failed; see {log})"
    # setuptools copies an extension whose C code did not change (an edit to a comment, a
    # touch) with its old time: stamp each as built now, so none looks older than its source.
    for path in _extensions():
        os.utime(path)
    return f"crossbar build: compiled (mypyc, {len(COMPILED)} modules, {took:.0f} s)"


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "sources":
        print(" ".join(_sources()))
    elif command == "compile":
        print(compile_in_place())
    else:
        print("usage: python crossbar/build.py sources|compile", file=sys.stderr)
        sys.exit(2)
