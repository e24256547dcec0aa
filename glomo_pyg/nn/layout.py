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
# as sparse edges, by longest sequence length: the crossovers measured by
# `python -m benchmarks.speed --quick` (2026-11-22, 2-core AMD EPYC CPU, forward +
# backward, B=4, 8 heads, width 512; run 10 in benchmarks/results/speed.md, after the
# sparse product moved to int32 indices and a row-chunked backward, which made it
# 1.5-2x faster: dense wins from 5% at T <= 64 and from 25% at T = 128..512; at T = 128
# and 25% the two are tied within 3%).
# Lengths between rows use the next longer row.
# Beyond 512 the last row is used: at a fixed density both layouts cost O(T^2) per
# sequence, so the crossover density is expected to stay put, but that is not measured
# yet. No GPU table has been measured; GPUs use this CPU table until one is.
CROSSOVER = ((64, 0.05), (128, 0.05), (256, 0.25), (512, 0.25))


# 'auto' emits the fused layout (FlexAttention) for graphs emitted without gradients
# (transfer with a frozen predictor, inference) from this longest length on: measured
# by `python -m benchmarks.speed --quick --sections transfer` (2026-11-22, 2-core AMD
# EPYC, run 16 in benchmarks/results/speed.md). GlomoTransfer forward relative to the
# sparse layout: fused 0.97 / dense 0.85 at T=128, 0.82 / 0.79 at T=256, 0.61 / 0.72 at
# T=512, 0.28 / 0.47 at T=1024 (images). Training keeps the sparse/dense choice: on CPU
# FlexAttention has no backward, and the GPU backward is not measured yet.
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
