"""Request bodies given back to the system when their requests end, under glibc's malloc.

glibc serves a large allocation with its own `mmap` and unmaps it when freed, but each such
free raises its mmap threshold (up to 32 MiB): after the first large body has come and gone,
later ones are carved from the heap, which gives memory back only from its top. Under many
concurrent uploads crossbar's RSS then stayed at the peak long after the bodies were answered
(docs/performance.md, "Request bodies in memory": 618 MB held 10 s after 150 slow 2 MiB
uploads). A fixed threshold keeps every buffer over it mapped, so it is unmapped when freed.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
THRESHOLD = 128 * 1024  # glibc's own starting value, held fixed


def fix_mmap_threshold(environ: Mapping[str, str] = os.environ) -> bool:
    """Hold glibc's mmap threshold at THRESHOLD for this process; False where there is no
    glibc, or the operator set `MALLOC_MMAP_THRESHOLD_` (theirs stands)."""
    if "MALLOC_MMAP_THRESHOLD_" in environ:
        return False
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return False  # not glibc (musl, macOS): its allocator decides
    return bool(libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD))
