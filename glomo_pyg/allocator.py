"""Keeping freed memory in the process, so CPU training steps stop paying for page faults.

PyTorch's CPU tensors come straight from ``malloc``. glibc serves blocks above its mmap
threshold (at most 32 MiB) with a fresh ``mmap`` and unmaps them on ``free``, so every
step of a text model re-faults its largest tensors page by page (the decoder's logits
alone are tens of MiB). The gain is measured by ``python -m benchmarks.cpu_recipe_step``
(``docs/training.md``, "Time on 2 cores").
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
    above 2 GiB free at its top. Results do not change, only where the bytes come from;
    the cost is a resident size that stays near its peak (inherited by forked processes
    such as DataLoader workers). Threads other than the main one still map blocks above
    64 MiB afresh, and a preloaded allocator (jemalloc, tcmalloc) is not affected.

    Applied by the ``glomo`` executable and the reproduction scripts, not by importing
    the library; ``GLOMO_MALLOC=system`` leaves malloc as it is, another value than
    ``keep`` or ``system`` raises ``ValueError``. Returns whether the setting was applied
    (``False`` off Linux/glibc).
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
