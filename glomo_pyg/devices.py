"""The one check of a ``device=`` argument: a device this machine has, named otherwise."""
from __future__ import annotations

from typing import Optional, Union

import torch


def check_device(device: Optional[Union[str, torch.device]]) -> torch.device:
    """``device`` as a ``torch.device`` this machine can run on (``None``: CUDA when
    available, else the CPU), else a ``ValueError`` naming ``device``: an unknown name, the
    meta device, a backend this machine lacks, a CUDA index beyond its devices."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except (RuntimeError, TypeError):  # (torch's words list every device type it knows)
        raise ValueError(f"device must be None, a torch.device or a device name such as "
                         f"'cpu', 'cuda' or 'cuda:1', got {device!r}") from None
    if chosen.type == "meta":
        raise ValueError(f"device={device!r}: nothing runs on the meta device "
                         f"(shapes without values); pass 'cpu', 'cuda' or None")
    backend = getattr(torch, chosen.type, None)  # torch.cuda, torch.mps, torch.xpu, ...
    available = getattr(backend, "is_available", None)
    if callable(available) and not available():
        raise ValueError(f"device={device!r} but {chosen.type.upper()} is not available on "
                         f"this machine (torch {torch.__version__}); pass device='cpu', or "
                         f"None for CUDA when there is one")
    if chosen.type == "cuda" and chosen.index is not None and \
            chosen.index >= torch.cuda.device_count():
        raise ValueError(f"device={device!r} but this machine has "
                         f"{torch.cuda.device_count()} CUDA device(s): cuda:0 to "
                         f"cuda:{torch.cuda.device_count() - 1}")
    return chosen
