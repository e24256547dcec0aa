"""Keeping freed memory in the process, so CPU training steps stop paying for page faults
(glibc maps large blocks afresh and unmaps them on ``free``; docs/training.md, "Time on 2
cores", explains and measures it)."""
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
                and (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"))
    except (ValueError, OSError, AttributeError):  # no such confstr name here
        return False


def keep_freed_memory() -> bool:
    """Make glibc's ``malloc`` keep freed memory for reuse in this process (never on
    import; docs/training.md). Returns whether it was applied (``False`` off Linux/glibc
    or with ``GLOMO_MALLOC=system``; another value raises :class:`ValueError`)."""
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
