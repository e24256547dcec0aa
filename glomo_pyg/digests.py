"""The digests every cache keys on: SHA-256 of settings (as JSON) and of weights."""
from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

import torch
from torch import Tensor


def digest(parts: Any) -> str:
    """SHA-256 (hex) of JSON-serialisable ``parts`` (keys sorted)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def canonical_digest(value: Any) -> str:
    """SHA-256 (hex) of ``value``'s canonical JSON (keys sorted, no spaces, ASCII, no NaN):
    the digest written into files (a sealed predictor's ``seal``, the GPU ledger's
    recipes), which must never change for the same value."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False,
                      ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def weights_digest(parts: Any, tensors: Mapping[str, Tensor]) -> str:
    """SHA-256 (hex) of ``parts`` (JSON, keys sorted, other objects by ``str``) and of
    each tensor's name, dtype, shape and bytes, in name order: equal exactly when the
    settings and every weight are."""
    h = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode())
    for name, t in sorted(tensors.items()):
        add_tensor(h, name, t)
    return h.hexdigest()


def add_tensor(h: "hashlib._Hash", name: str, tensor: Tensor) -> None:
    """Feed ``tensor``'s name, dtype, shape and bytes to the hash ``h``."""
    t = tensor.detach().to("cpu").contiguous()
    h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
