"""The statistics every benchmark reports: mean and standard deviation over seeds, and
the mean paired difference with its two-sided 95% Student-t interval."""
from __future__ import annotations

import math
from typing import Sequence, Tuple

# Two-sided 95% quantiles of Student's t, t(0.975, df) for df = 1..30 (scipy is no
# dependency); beyond 30 the normal 1.96 (at most 2% narrower than t there).
T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
        2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
        2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)


def t_quantile_975(df: int) -> float:
    """t(0.975, df): the half-width factor of a two-sided 95% Student-t interval."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    return T975[df - 1] if df <= len(T975) else 1.96


def mean_sd(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation of ``values`` (one value: sd NaN)."""
    if not values:
        raise ValueError("no values")
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, math.nan
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def paired_difference(a: Sequence[float], b: Sequence[float]
                      ) -> Tuple[float, float, float, int]:
    """Mean of the paired differences ``a[i] - b[i]`` (e.g. two variants' test accuracies
    with the same seed) and its two-sided 95% Student-t confidence interval:
    ``(mean, low, high, n)``. One pair gives no interval: ``low`` and ``high`` are NaN."""
    if len(a) != len(b):
        raise ValueError(f"paired samples need equal lengths, got {len(a)} and {len(b)}")
    n = len(a)
    if n == 0:
        raise ValueError("no pairs")
    diffs = [float(x) - float(y) for x, y in zip(a, b)]
    mean = sum(diffs) / n
    if n == 1:
        return mean, math.nan, math.nan, 1
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = t_quantile_975(n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half, n
