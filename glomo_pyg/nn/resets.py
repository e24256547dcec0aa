"""Re-initialising composite models: each part as its own constructor initialised it."""
from __future__ import annotations

from typing import Iterable

import torch


def reset_module(module: torch.nn.Module) -> None:
    """Re-initialise ``module``: its own ``reset_parameters``, else each child in turn.
    Like PyG's :func:`torch_geometric.nn.inits.reset`, but :class:`torch.nn.MultiheadAttention`
    (whose input projection is a parameter of its own, reset by its private method, and
    whose output projection is drawn by its constructor) is re-initialised as built."""
    if isinstance(module, torch.nn.MultiheadAttention):
        module.out_proj.reset_parameters()  # (drawn by its constructor, not by the method)
        getattr(module, "_reset_parameters")()  # noqa: B009 (Module.__getattr__ types it a Tensor)
        return
    reset = getattr(module, "reset_parameters", None)
    if callable(reset):
        reset()
    else:
        for child in module.children():
            reset_module(child)


def reset_children(module: torch.nn.Module, keep: Iterable[torch.nn.Module] = ()) -> None:
    """:func:`reset_module` on each child of ``module`` except those in ``keep``."""
    kept = {id(m) for m in keep}
    for child in module.children():
        if id(child) not in kept:
            reset_module(child)
