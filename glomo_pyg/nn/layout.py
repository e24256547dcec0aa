"""The one place where ``layout='auto'`` is decided: sparse edges, dense blocks or fused
keys and queries (:mod:`glomo_pyg.graphs.storage`), from the batch's shape before the
graphs are scored (:func:`auto_layout`) and from their density after
(:func:`settle_auto`). Emitters call these two and nothing else decides a layout."""
from __future__ import annotations

import torch

from glomo_pyg import flex, kernels
from glomo_pyg.graphs import LatentGraphs

LAYOUTS = ("sparse", "dense", "fused", "auto")

# A dense layer holds B * H * T^2 weights, and training keeps about six tensors of that
# size per layer and direction for the backward (scores, masks, normalisation terms):
# above this many weights (64 MiB in fp32 per tensor), 'auto' always emits sparse edges.
DENSE_MAX_WEIGHTS = 1 << 24

# Density (edges / allowed pairs) from which on dense blocks aggregate at least as fast
# as sparse edges, by longest sequence length (a length uses the next longer row, beyond
# 512 the last: both layouts cost O(T^2) per sequence at a fixed density). CPU crossovers
# of benchmarks/results/speed.md (runs 10, 11, 13); GPUs use them until theirs are measured.
CROSSOVER = ((64, 0.05), (128, 0.05), (256, 0.25), (512, 0.25))

# 'auto' emits the fused layout (FlexAttention) for graphs emitted without gradients
# (transfer with a frozen predictor, inference) from this longest length on, where it
# beats both others (benchmarks/results/speed.md, transfer sections). Training keeps the
# sparse/dense choice: on CPU FlexAttention has no backward.
FUSED_MIN_LEN = 512


def use_fused(max_len: int, like: torch.Tensor) -> bool:
    return (not torch.is_grad_enabled() and max_len >= FUSED_MIN_LEN and flex.available()
            and like.dtype in flex.DTYPES)


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


def auto_layout(num_sequences: int, num_nodes: int, max_len: int, heads: int,
                include_self: bool, like: torch.Tensor) -> str:
    """What ``'auto'`` scores a batch into: ``'fused'`` for long sequences without
    gradients (:func:`use_fused`) and for batches too large for the other layouts where
    FlexAttention can run; ``'dense'`` when the blocks fit (whether they stay dense is
    decided from their density, :func:`settle_auto`); otherwise ``'sparse'``."""
    if use_fused(max_len, like):
        return "fused"
    if dense_fits(num_sequences, heads, max_len):
        return "dense"
    pairs = kernels.graph_pairs("sparse", num_sequences, num_nodes, max_len, heads,
                                include_self)
    if pairs > kernels.MAX_GRAPH_PAIRS and flex.available() and like.dtype in flex.DTYPES \
            and (like.is_cuda or not torch.is_grad_enabled()):
        return "fused"
    return "sparse"


def unfused_layout(num_sequences: int, heads: int, max_len: int) -> str:
    """Where ``'auto'`` chose fused graphs that cannot be fused after all (softmax scores
    that could overflow): dense blocks if they fit, else sparse edges."""
    return "dense" if dense_fits(num_sequences, heads, max_len) else "sparse"


def settle_auto(graphs: LatentGraphs) -> LatentGraphs:
    """Dense blocks that ``'auto'`` scored, kept dense if they are dense enough for
    batched matmuls to win (:func:`choose_layout` on their mean density), else their
    edges."""
    if graphs.layout != "dense":
        return graphs
    density = sum(graphs.density()) / graphs.num_layers
    if choose_layout(graphs.num_sequences, graphs.num_heads, graphs.sequences.max_len,
                     density) == "sparse":
        return graphs.to_sparse()
    return graphs
