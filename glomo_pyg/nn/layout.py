"""The one place where ``layout='auto'`` is decided: from the batch's shape before the
graphs are scored (:func:`auto_layout`) and from their density after (:func:`settle_auto`)."""
from __future__ import annotations

import torch

from glomo_pyg import flex, kernels
from glomo_pyg.graphs import LatentGraphs

LAYOUTS = ("sparse", "dense", "fused", "auto")

# A dense layer holds B * H * T^2 weights, and training keeps about six tensors of that
# size for the backward: above this many weights, 'auto' always emits sparse edges.
DENSE_MAX_WEIGHTS = 1 << 24

# Density (edges / allowed pairs) from which on dense blocks aggregate at least as fast
# as sparse edges, by longest sequence length (the next longer row; beyond 512 the last).
# The crossovers measured on a CPU (benchmarks/results/speed.md, "CPU runs 1-13"), used
# on GPUs too.
CROSSOVER = ((64, 0.05), (128, 0.05), (256, 0.25), (512, 0.25))

# Without gradients, 'auto' emits the fused layout (FlexAttention) from this longest
# length on, where it beats both others (benchmarks/results/speed.md, transfer sections).
FUSED_MIN_LEN = 512


def dense_fits(num_sequences: int, heads: int, max_len: int) -> bool:
    return num_sequences * heads * max_len * max_len <= DENSE_MAX_WEIGHTS


def choose_layout(num_sequences: int, heads: int, max_len: int, density: float) -> str:
    """``'dense'`` when the blocks fit and the graphs are dense enough for batched
    matmuls to beat the sparse product, else ``'sparse'``."""
    crossover = next((d for length, d in CROSSOVER if max_len <= length), CROSSOVER[-1][1])
    return "dense" if dense_fits(num_sequences, heads, max_len) and density >= crossover \
        else "sparse"


def auto_layout(num_sequences: int, num_nodes: int, max_len: int, heads: int,
                include_self: bool, like: torch.Tensor) -> str:
    """What ``'auto'`` scores a batch into: ``'fused'`` for long sequences without
    gradients and for batches too large for the other layouts where FlexAttention can
    run; ``'dense'`` when the blocks fit (:func:`settle_auto` decides if they stay);
    otherwise ``'sparse'``."""
    if not torch.is_grad_enabled() and max_len >= FUSED_MIN_LEN and flex.available() \
            and like.dtype in flex.DTYPES:
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
    """Where ``'auto'`` chose fused graphs that cannot be fused after all: dense blocks if
    they fit, else sparse edges."""
    return "dense" if dense_fits(num_sequences, heads, max_len) else "sparse"


def settle_auto(graphs: LatentGraphs) -> LatentGraphs:
    """Dense blocks that ``'auto'`` scored, kept if dense enough for batched matmuls to
    win (:func:`choose_layout` on their mean density), else their edges."""
    if graphs.layout == "dense" and choose_layout(
            graphs.num_sequences, graphs.num_heads, graphs.sequences.max_len,
            sum(graphs.density()) / graphs.num_layers) == "sparse":
        return graphs.to_sparse()
    return graphs
