"""Shared bits of the benchmark scripts: hardware description and result files."""
from __future__ import annotations

import platform

import torch


def hardware(device: str = "cpu") -> str:
    """What the numbers were measured on."""
    if device != "cpu":
        return torch.cuda.get_device_name()
    name = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            name = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {torch.get_num_threads()} torch threads"


def append_results(path: str, lines) -> str:
    """Append a markdown section to a results file and return its text."""
    text = "\n".join(lines) + "\n"
    with open(path, "a") as fh:
        fh.write(text)
    return text
