"""Choosing between the sparse and the dense graph layout (see LatentGraphs)."""
from __future__ import annotations

LAYOUTS = ("sparse", "dense", "auto")

# A dense layer holds B * H * T^2 weights (plus autograd intermediates when training):
# above this many, 'auto' always emits sparse edges.
DENSE_MAX_WEIGHTS = 1 << 26

# Density (edges / allowed pairs) above which dense blocks aggregate faster than sparse
# edges, by longest sequence length: measured crossovers from
# benchmarks/results/speed.md (CPU quick mode, forward + backward, width 512, 8 heads).
# Lengths between table rows use the next longer row; beyond the last, the last row.
CROSSOVER = ((64, 0.0), (128, 0.0), (256, 0.0), (512, 0.0))


def crossover_density(max_len: int) -> float:
    for length, density in CROSSOVER:
        if max_len <= length:
            return density
    return CROSSOVER[-1][1]


def dense_fits(num_sequences: int, heads: int, max_len: int) -> bool:
    return num_sequences * heads * max_len * max_len <= DENSE_MAX_WEIGHTS


def choose_layout(num_sequences: int, heads: int, max_len: int, density: float) -> str:
    """``'dense'`` when the blocks fit and the graphs are dense enough for batched
    matmuls to beat the sparse product, else ``'sparse'``."""
    if not dense_fits(num_sequences, heads, max_len):
        return "sparse"
    return "dense" if density >= crossover_density(max_len) else "sparse"
