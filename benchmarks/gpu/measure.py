"""Steady-state timing of a training step on the GPU: the first step (compilation and
lazy initialisation) apart, then warm-up, then each step timed between synchronisations,
the peak memory of a step, and the top kernels from ``torch.profiler``."""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List

import torch

from benchmarks.speed.measure import sync, times_ms


def top_kernels(step: Callable[[], object], device: str, steps: int = 3,
                count: int = 12) -> List[Dict]:
    """The ``count`` costliest device kernels of ``steps`` calls of ``step`` by device
    time (operators by CPU time on the CPU), per step.

    On the GPU only kernel events count: the operator that launches a kernel carries the
    same device time as its own "self" time, so counting both lists each kernel twice and
    halves every share."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    sync(device)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync(device)
    attr = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, attr, 0) > 0
              and (device != "cuda" or e.device_type == DeviceType.CUDA)]
    events.sort(key=lambda e: getattr(e, attr), reverse=True)
    total = sum(getattr(e, attr) for e in events) or 1.0
    return [dict(name=e.key[:100], ms_per_step=round(getattr(e, attr) / 1e3 / steps, 3),
                 share=round(getattr(e, attr) / total, 4), calls_per_step=e.count / steps,
                 kind="kernel" if device == "cuda" else "operator")
            for e in events[:count]]


def time_steps(step: Callable[[], object], device: str, warmup: int, steps: int,
               profile_steps: int = 3) -> Dict:
    """``first_step_s`` (compilation included), then after ``warmup`` more steps the
    median and mean of ``steps`` timed steps (ms), the peak memory of a step above what
    was held before it (MiB), and the top kernels."""
    sync(device)
    start = time.perf_counter()
    step()
    sync(device)
    first = time.perf_counter() - start
    for _ in range(warmup):
        step()
    times = times_ms(step, steps, device)
    peak = None
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)
    return dict(first_step_s=round(first, 3), median_ms=round(statistics.median(times), 3),
                mean_ms=round(statistics.fmean(times), 3), min_ms=round(min(times), 3),
                max_ms=round(max(times), 3), steps=steps, warmup=warmup, peak_mib=peak,
                top=top_kernels(step, device, profile_steps) if profile_steps else [])
