"""Keeping freed memory in the process, so CPU training steps stop paying for page faults.

PyTorch's CPU tensors come straight from ``malloc``. glibc serves blocks above its mmap
threshold (at most 32 MiB) with a fresh ``mmap`` and unmaps them on ``free``, so every
step of a text model re-faults its largest tensors page by page: the decoder's logits
alone (positions x context x vocabulary floats) are tens of MiB. In 3,000 steps of
``configs/imdb-cpu.yaml`` on 2 cores that was 245 million minor page faults and 21% of
the CPU time spent in the kernel. With freed memory kept for reuse, a step of that
model (``layout: auto``) took 0.51 s instead of 0.73 s (``python -m benchmarks.cpu_recipe_step``;
``docs/training.md``, "Time on 2 cores").
"""
from __future__ import annotations

import ctypes
import os
import sys

# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_INT_MAX = 2 ** 31 - 1
ENV = "GLOMO_MALLOC"  # 'system' leaves malloc's settings alone
CHOICES = ("keep", "system")


def _glibc() -> bool:
    try:
        return (sys.platform.startswith("linux")
                and os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"))
    except (ValueError, OSError, AttributeError):  # no such confstr name here
        return False


def keep_freed_memory() -> bool:
    """Make glibc's ``malloc`` keep freed memory for reuse in this process: large blocks
    come from the heap instead of a fresh ``mmap`` each, and the heap is trimmed only
    above 2 GiB of free memory at its top, so later allocations of the same sizes reuse
    pages already mapped. Results do not change, only where the bytes come from.

    The cost is memory: the resident size stays near its peak until the process ends,
    and processes forked from it (e.g. DataLoader workers) inherit the setting. Threads
    other than the main one still map blocks above 64 MiB afresh (glibc's arenas). Only
    glibc's own ``malloc`` is affected: under a preloaded allocator (jemalloc, tcmalloc)
    this does nothing useful.

    Applied by the ``glomo`` executable and the reproduction scripts, not by importing
    the library. ``GLOMO_MALLOC=system`` in the environment leaves malloc as it is.
    Returns whether the setting was applied (``False`` off Linux/glibc, where nothing is
    done); a ``GLOMO_MALLOC`` other than ``keep`` or ``system`` raises ``ValueError``.
    """
    choice = os.environ.get(ENV, "keep")
    if choice not in CHOICES:
        raise ValueError(f"{ENV} must be one of {CHOICES}, got {choice!r}")
    if choice == "system" or not _glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: glibc's
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _INT_MAX))
