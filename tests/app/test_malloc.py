"""crossbar holds glibc's mmap threshold fixed, so a large request body's buffer is mapped on
its own and unmapped when its request ends, the thousandth as much as the first; without it,
glibc raises the threshold at the first large free and later bodies are carved from a heap
that keeps its memory (docs/performance.md, "Request bodies in memory")."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from crossbar.app.malloc import fix_mmap_threshold

# In a process of its own: where does a 2 MiB body land after one has come and gone?
PROBE = textwrap.dedent(
    """
    import sys
    from crossbar.app.malloc import fix_mmap_threshold

    def in_heap(address):
        for line in open("/proc/self/maps"):
            if line.rstrip().endswith("[heap]"):
                low, high = (int(x, 16) for x in line.split()[0].split("-"))
                if low <= address < high:
                    return True
        return False

    fixed = sys.argv[1] == "fixed" and fix_mmap_threshold({})
    first = b"a" * (2 * 1024 * 1024)
    del first  # glibc raises its threshold here, unless it is fixed
    second = b"b" * (2 * 1024 * 1024)
    print(fixed, in_heap(id(second)))
    """
)


def glibc() -> bool:
    import ctypes

    return hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


def probe(mode: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux") or not glibc(), reason="glibc only")
def test_a_large_body_after_another_is_still_mapped_on_its_own_and_so_given_back():
    assert probe("plain") == "False True"  # glibc's own way: the second from the heap
    assert probe("fixed") == "True False"  # held fixed: mapped, unmapped when freed


def test_an_operators_own_threshold_stands():
    assert fix_mmap_threshold({"MALLOC_MMAP_THRESHOLD_": "65536"}) is False
