"""Timing and peak-memory measurement shared by the speed benchmarks."""
from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from typing import Callable, Tuple

import torch

# glibc serves large blocks from its own cache after the first frees, which would hide
# them from the resident-set peak; a fixed mmap threshold makes every large tensor a
# fresh mapping, so the peak RSS of a run is the peak of what it allocated.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def ensure_malloc_env() -> None:
    """Re-execute the current command with ``MALLOC_ENV`` set (CPU memory peaks)."""
    if all(os.environ.get(k) == v for k, v in MALLOC_ENV.items()):
        return
    os.environ.update(MALLOC_ENV)
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_ms(fn: Callable[[], object], repeats: int, device: str) -> float:
    fn()  # warm-up (allocator, kernels, lazy init)
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_mib(fn: Callable[[], object], device: str) -> float:
    """Peak memory allocated while ``fn`` runs, above what was held before (MiB).

    GPU: ``torch.cuda.max_memory_allocated``. CPU: the resident-set high-water
    mark (reset through ``/proc/self/clear_refs``) minus the resident set before.
    """
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset the high-water mark to the current resident set
    base = _status_kib("VmRSS")
    fn()
    return (_status_kib("VmHWM") - base) / 1024


def time_and_memory(fn: Callable[[], object], repeats: int, device: str) -> Tuple[float, float]:
    return median_ms(fn, repeats, device), peak_mib(fn, device)
