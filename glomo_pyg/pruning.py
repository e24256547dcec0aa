r"""Pruned graphs: each target's ``top_k`` heaviest sources and the weights at or above
``min_weight``, from dense rows (:func:`prune_rows`) or straight from a graph layer's keys
and queries, block by block (:func:`pruned_graph_edges`), so that the ``T x T`` graph is
never formed: memory is the edges kept plus one block of scores.

Both follow one rule (docs/transforms.md, "Pruning"): weights below ``min_weight`` are
dropped, then each target keeps its ``top_k`` heaviest sources, ties going to the lower
source; zero weights are never edges; kept weights are not renormalised.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from glomo_pyg.kernels import _normalise, _scaled
from glomo_pyg.ordering import RasterOrder, SequenceOrder

# Scores one block holds (float32: 8 MiB): blocks stay in the CPU's last-level cache, where
# the in-place normalisation runs at memory speed (benchmarks/results/transform_speed.md).
BLOCK_SCORES = 1 << 21
# Fewest targets per block: narrower blocks make the score products inefficient.
MIN_BLOCK_TARGETS = 64

#: ``(sample, relation, target, source, weight)`` of kept edges, in that sort order.
PrunedEdges = Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]


def prune_rows(dense: Tensor, top_k: Optional[int] = None,
               min_weight: Optional[float] = None) -> PrunedEdges:
    """``(sample, relation, target, source, weight)`` of the entries of ``dense``
    (``[B, R, targets, sources]``, rows = one target's sources) that pruning keeps, sorted
    in that order; ``target`` and ``source`` index the rows and columns."""
    if top_k is None or top_k >= dense.size(-1):
        if min_weight is not None:
            dense = dense.masked_fill(dense < min_weight, 0)
        b, relation, tgt, src = dense.nonzero(as_tuple=True)
        return b, relation, tgt, src, dense[b, relation, tgt, src]
    # the top k of each row, put back in source order; the weights >= min_weight among
    # them are the top k of those >= min_weight
    k = top_k
    weight, source = dense.topk(k + 1, dim=-1)
    # rows whose k-th weight ties with the (k+1)-th: the lower sources win
    tied = (weight[..., k] == weight[..., k - 1]) & (weight[..., k - 1] > 0)
    if bool(tied.any()):
        weight[tied], source[tied] = (t[..., :k + 1] for t in
                                      dense[tied].sort(dim=-1, descending=True, stable=True))
    weight, source = weight[..., :k], source[..., :k]
    source, order = source.sort(dim=-1)
    weight = weight.gather(-1, order)
    floor = 0.0 if min_weight is None else min_weight
    keep = (weight > 0) & (weight >= floor)
    b, relation, tgt, slot = keep.nonzero(as_tuple=True)
    return b, relation, tgt, source[b, relation, tgt, slot], weight[b, relation, tgt, slot]


def _source_range(order: SequenceOrder, j0: int, j1: int, t: int,
                  window: Optional[int]) -> Tuple[int, int]:
    """The sources ``[i0, i1)`` any target in ``[j0, j1)`` may have (the window's rows)."""
    forward = order.direction == "forward"
    i0, i1 = (0, j1) if forward else (j0, t)  # (sources i <= j, or i >= j, cover both)
    if window is None:
        return i0, i1
    if isinstance(order, RasterOrder):  # whole rows of the window
        w = order.width
        return (max(i0, (j0 // w - window) * w), i1) if forward else \
            (i0, min(i1, ((j1 - 1) // w + window + 1) * w))
    return (max(i0, j0 - window), i1) if forward else (i0, min(i1, j1 + window))


def _allowed_block(order: SequenceOrder, j0: int, j1: int, i0: int, i1: int,
                   lengths: Tensor, window: Optional[int]) -> Tensor:
    """``[B or 1, 1, tj, ti]`` allowed (target, source) pairs of the block."""
    allowed = order.block_mask(j0, j1, i0, i1, lengths)  # [B, tj, ti]
    if window is not None:
        j = torch.arange(j0, j1, device=lengths.device).view(-1, 1)
        i = torch.arange(i0, i1, device=lengths.device).view(1, -1)
        allowed = allowed & (order.window_distance(j, i) <= window)
    return allowed.unsqueeze(1)


def _relu2_block(scores: Tensor, allowed: Tensor) -> Tensor:
    """:func:`glomo_pyg.kernels._normalise` (``'relu2'``) of a fresh block of finite
    scores, in place (``allowed`` as 0 / 1 in their dtype)."""
    scores.clamp_min_(0.0).mul_(allowed)  # (a product: much faster than a broadcast fill)
    top = scores.amax(-1, keepdim=True)
    scores.div_(top.masked_fill_(top <= 0, 1.0)).square_()
    total = scores.sum(-1, keepdim=True)
    return scores.div_(total.masked_fill_(total <= 0, 1.0))


def _blocks(num_seqs: int, heads: int, t: int, block_scores: int):
    """``(samples per block, targets per block)`` of blocks of at most ``block_scores``."""
    targets = min(t, MIN_BLOCK_TARGETS)
    group = max(1, min(num_seqs, block_scores // max(1, heads * t * targets)))
    return group, max(1, min(t, block_scores // max(1, group * heads * t)))


def pruned_graph_edges(layers: Sequence[Tuple[Tensor, Tensor]], lengths: Tensor, *,
                       order: SequenceOrder, normalization: str = "relu2",
                       heads: Optional[Sequence[int]] = None, merge: Optional[str] = None,
                       top_k: Optional[int] = None, min_weight: Optional[float] = None,
                       window: Optional[int] = None,
                       block_scores: int = BLOCK_SCORES) -> PrunedEdges:
    r"""The pruned edges of graph layers given by their keys and queries, computed block
    by block of targets: each block's graphs (paper Eq. 1) are normalised, merged and
    pruned (:func:`prune_rows`) before the next, so memory is the edges kept plus one
    block of ``block_scores`` scores.

    Args:
        layers: per graph layer the augmented ``[B, H, T, D]`` (keys, queries) whose inner
            products are the scores (:meth:`glomo_pyg.nn.GraphScorer.augmented`).
        lengths: ``[B]`` valid lengths (padded keys and queries are ignored).
        order: the allowed-sources rule (:class:`~glomo_pyg.ordering.SequenceOrder`, or a
            :class:`~glomo_pyg.ordering.RasterOrder` for a window over image rows).
        normalization: ``'relu2'`` (Eq. 1) or ``'softmax'``.
        heads: the heads kept of each layer (default: all).
        merge: ``None`` (relation ``l * len(heads) + h``), ``'sum'`` or ``'mean'`` (one
            relation: the sum, or the mean, over the layers and heads).
        top_k, min_weight: the pruning of :func:`prune_rows`.
        window: only sources at most this far (``order.window_distance``), masked before
            normalising.

    Returns ``(sample, relation, target, source, weight)`` sorted in that order; targets
    and sources are positions within their sample, weights float32 (float64 inputs:
    float64).
    """
    b, h, t, _ = layers[0][0].shape
    heads = list(range(h)) if heads is None else list(heads)
    every_head = len(heads) == h
    dtype = torch.promote_types(layers[0][0].dtype, torch.float32)
    scaled = [_scaled(k, q, dtype) for k, q in layers]
    if not every_head:
        scaled = [(k[:, heads], q[:, heads], (u[0][:, heads], u[1][:, heads]))
                  for k, q, u in scaled]
    per_layer = len(heads)
    relations = 1 if merge is not None else len(layers) * per_layer
    group, tile = _blocks(b, per_layer, t, block_scores)
    parts: List[PrunedEdges] = []
    with torch.autocast(lengths.device.type, enabled=False):
        for b0 in range(0, b, group):
            b1 = min(b, b0 + group)
            for j0 in range(0, t, tile):
                j1 = min(t, j0 + tile)
                i0, i1 = _source_range(order, j0, j1, t, window)
                allowed = _allowed_block(order, j0, j1, i0, i1, lengths[b0:b1], window)
                ones = allowed.to(dtype)
                total = None
                for l, (k, q, unscale) in enumerate(scaled):
                    scores = q[b0:b1, :, j0:j1] @ k[b0:b1, :, i0:i1].transpose(-1, -2)
                    if normalization == "relu2":
                        g = _relu2_block(scores, ones)
                    else:
                        g, _ = _normalise(scores, allowed, normalization,
                                          (unscale[0][b0:b1, :, j0:j1], unscale[1][b0:b1]))
                    if merge is None:
                        s, r, tgt, src, w = prune_rows(g, top_k, min_weight)
                        parts.append((s + b0, r + l * per_layer, tgt + j0, src + i0, w))
                    else:
                        total = g.sum(1, keepdim=True) if total is None else \
                            total.add_(g.sum(1, keepdim=True))
                if merge is not None:
                    if merge == "mean":
                        total.div_(len(layers) * per_layer)
                    s, r, tgt, src, w = prune_rows(total, top_k, min_weight)
                    parts.append((s + b0, r, tgt + j0, src + i0, w))
    sample, relation, target, source, weight = (torch.cat(p) for p in zip(*parts))
    # blocks come target range by target range: a stable sort by (sample, relation) keeps
    # each relation's targets ascending
    key = sample * relations + relation
    if key.numel() > 1 and bool((key[1:] < key[:-1]).any()):
        key, perm = key.sort(stable=True)
        sample, relation, target, source, weight = (x[perm] for x in
                                                    (sample, relation, target, source, weight))
    return sample, relation, target, source, weight
