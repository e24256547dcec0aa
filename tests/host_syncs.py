"""Counting host-device synchronisations in Python code: every call of ``Tensor.item``,
``Tensor.tolist``, ``bool(tensor)`` (``Tensor.__bool__``), ``Tensor.cpu``,
``Tensor.numpy``, ``int(tensor)`` and ``float(tensor)`` made while the context is open.
On a GPU each one waits for the device; on the CPU they are the same calls, so a test
here proves the steady-state forward of a layer launches kernels and returns."""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator

import torch

SYNCING = ("item", "tolist", "__bool__", "cpu", "numpy", "__int__", "__float__")


@contextlib.contextmanager
def count_host_syncs() -> Iterator[Dict[str, int]]:
    """Yields a dict ``{method: calls}`` filled while the block runs."""
    counts: Dict[str, int] = {name: 0 for name in SYNCING}
    originals = {name: getattr(torch.Tensor, name) for name in SYNCING}

    def counting(name, original):
        def wrapper(self, *args, **kwargs):
            counts[name] += 1
            return original(self, *args, **kwargs)
        return wrapper

    for name, original in originals.items():
        setattr(torch.Tensor, name, counting(name, original))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def total(counts: Dict[str, int]) -> int:
    return sum(counts.values())
