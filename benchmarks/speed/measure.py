"""Timing and peak-memory measurement shared by the speed benchmarks."""
from __future__ import annotations

import ctypes
import gc
import statistics
import time
from typing import Callable, List

import torch

# glibc serves large blocks from its heap cache after the first frees, which would hide
# them from the resident-set peak. While a peak is measured, the mmap threshold is fixed
# low so every large tensor is a fresh mapping (the peak RSS is the peak of what the run
# allocated); afterwards it is set to glibc's dynamic maximum, so timings see the
# allocator's usual steady state. (Fixing it low for the whole process instead would
# time every allocation as an mmap plus page faults.)
_M_MMAP_THRESHOLD = -3
_LOW, _HIGH = 64 * 1024, 32 * 1024 * 1024


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: peaks may then under-count reused memory
        return None


def _mallopt(value: int) -> None:
    libc = _libc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, value)


def _release_free_memory() -> None:
    """Return glibc's cached free blocks to the OS, so reusing them shows in the RSS."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


class NoCases(Exception):
    """A section has no case of the lengths selected with ``--lengths``."""


def cases_of(args, cases, length):
    """The ``cases`` whose sequence length (``length(case)``) is selected; ``NoCases`` if
    none is."""
    kept = [c for c in cases if selected(args, length(c))]
    if not kept:
        raise NoCases
    return kept


def selected(args, t: int) -> bool:
    """Whether a case of sequence length ``t`` runs (``--lengths``: only those lengths)."""
    return not getattr(args, "lengths", None) or t in args.lengths


def set_timing_allocator() -> None:
    """Put glibc in its steady state (large blocks reused from the heap) before timing."""
    _mallopt(_HIGH)


def sync(device: str) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device == "cuda":
        torch.cuda.synchronize()


def times_ms(fn: Callable[[], object], repeats: int, device: str) -> List[float]:
    """``repeats`` calls of ``fn``, each timed between synchronisations (ms); no warm-up."""
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def median_ms(fn: Callable[[], object], repeats: int, device: str) -> float:
    fn()  # warm-up (allocator, kernels, lazy init)
    return statistics.median(times_ms(fn, repeats, device))


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_mib(fn: Callable[[], object], device: str) -> float:
    """Peak memory allocated while ``fn`` runs, above what was held before (MiB).

    GPU: ``torch.cuda.max_memory_allocated``. CPU: the resident-set high-water
    mark (reset through ``/proc/self/clear_refs``) minus the resident set before,
    with the allocator's free blocks returned to the OS first and large
    allocations forced to fresh mappings (see above).
    """
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    _mallopt(_LOW)
    _release_free_memory()
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # reset the high-water mark to the current resident set
        base = _status_kib("VmRSS")
        fn()
        return (_status_kib("VmHWM") - base) / 1024
    finally:
        _mallopt(_HIGH)
