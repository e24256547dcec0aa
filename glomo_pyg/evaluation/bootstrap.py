"""Paired bootstrap intervals of an accuracy difference over test samples and seeds."""
from __future__ import annotations

from typing import Tuple

import numpy as np
import torch
from torch import Tensor


def _as_matrix(correct, name: str) -> Tensor:
    t = torch.as_tensor(correct)
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.dim() != 2 or t.numel() == 0 or not bool(((t == 0) | (t == 1)).all()):
        raise ValueError(f"{name} must be [seeds, test samples] of 0/1 (or bool) outcomes, got "
                         f"shape {tuple(t.shape)}")
    return t.double()


def paired_bootstrap(correct_a, correct_b, resamples: int = 2000, seed: int = 0,
                     level: float = 0.95, chunk: int = 100) -> Tuple[float, float, float]:
    r"""Mean accuracy difference ``a - b`` (points, over seeds and test samples) and its
    percentile bootstrap interval, resampling the test samples (the same draw for both,
    so the comparison is paired) and, independently, the seeds:

    .. math::
        \Delta^{*} = \frac{1}{S N} \sum_s u_s \sum_i w_i (a_{si} - b_{si}),
        \quad w \sim \mathrm{Mult}(N, 1/N),\; u \sim \mathrm{Mult}(S, 1/S)

    Shapes: ``correct_a``, ``correct_b``: ``[S, N]`` 0/1 outcomes of seed ``s`` (the
    classifier's initialisation and validation split) on test sample ``i`` (a 1-D
    tensor is one seed). Returns ``(mean, low, high)`` in percentage points.
    """
    a, b = _as_matrix(correct_a, "correct_a"), _as_matrix(correct_b, "correct_b")
    if a.shape != b.shape:
        raise ValueError(f"correct_a and correct_b must pair the same seeds and test samples, "
                         f"got {tuple(a.shape)} and {tuple(b.shape)}")
    if not 0 < level < 1 or resamples < 1:
        raise ValueError(f"level must lie in (0, 1) and resamples be >= 1, got {level}, "
                         f"{resamples}")
    diff = (a - b).numpy()
    s, n = diff.shape
    rng = np.random.default_rng(seed)
    stats = []
    for start in range(0, resamples, chunk):
        r = min(chunk, resamples - start)
        w = rng.multinomial(n, np.full(n, 1.0 / n), size=r).astype(np.float64)  # [r, N]
        u = rng.multinomial(s, np.full(s, 1.0 / s), size=r).astype(np.float64)  # [r, S]
        stats.append(((u @ diff) * w).sum(1) / (s * n))
    values = np.concatenate(stats) * 100
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(diff.mean() * 100), float(low), float(high)
