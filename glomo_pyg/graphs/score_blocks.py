r"""Kernels that walk a graph layer's scores block of targets by block, from its keys and
queries, so that the ``T x T`` graph (paper Eq. 1) is never formed: memory is one block of
scores plus what is kept.

* :func:`pruned_graph_edges`: the edges pruning keeps (:mod:`glomo_pyg.graphs.pruning`), merged
  over layers and heads if asked;
* :func:`propagate_scores`: :math:`\sum_i G_{ij} v_i` per head and target (the fused
  layout's propagation on the CPU, where it beats FlexAttention and needs no compiler).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from glomo_pyg.graphs.pruning import PrunedEdges, prune_rows
from glomo_pyg.kernels import normalise_scores
from glomo_pyg.ordering import RasterOrder, UnitOrder

# Scores one block holds (float32: 8 MiB): blocks stay in the CPU's last-level cache, where
# the in-place normalisation runs at memory speed (benchmarks/results/image_graphs_cpu.md).
BLOCK_SCORES = 1 << 21
# Fewest targets per block: narrower blocks make the score products inefficient.
MIN_BLOCK_TARGETS = 128


def _source_range(order: UnitOrder, j0: int, j1: int, t: int,
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


def _allowed_block(order: UnitOrder, j0: int, j1: int, i0: int, i1: int,
                   lengths: Tensor, window: Optional[int]) -> Tensor:
    """``[B or 1, 1, tj, ti]`` allowed (target, source) pairs of the block."""
    allowed = order.block_mask(j0, j1, i0, i1, lengths)  # [B, tj, ti]
    if window is not None:
        j = torch.arange(j0, j1, device=lengths.device).view(-1, 1)
        i = torch.arange(i0, i1, device=lengths.device).view(1, -1)
        allowed = allowed & (order.window_distance(j, i) <= window)
    return allowed.unsqueeze(1)


def _relu2_terms(scores: Tensor, mask) -> Tuple[Tensor, Tensor]:
    """``(r, total)`` of :func:`glomo_pyg.kernels.normalise_scores` (``'relu2'``: the
    weights are ``r / total``) of a fresh block of finite scores, in place (``mask``:
    :meth:`_BlockScores.mask`); ``total`` is 1 for a target without an edge."""
    # (a product by 0 / 1: much faster than a broadcast fill)
    _BlockScores.apply(scores.clamp_min_(0.0), mask)
    top = scores.amax(-1, keepdim=True)
    scores.div_(top.masked_fill_(top <= 0, 1.0)).square_()
    total = scores.sum(-1, keepdim=True)
    return scores, total.masked_fill_(total <= 0, 1.0)


# Propagation needs every target's scores below 2**SQUARE_EXPONENTS[1] so squares and their
# sums stay finite without dividing each block by its rows' maxima (two passes fewer over
# every block), and not all below 2**SQUARE_EXPONENTS[0] (the squares would underflow); a
# target whose bound is outside is rescaled by an exact power of two (the squared-ReLU
# weights r / sum r do not change).
SQUARE_EXPONENTS = (-10, 50)


def _times_power_of_two(x: Tensor, exponent: Tensor) -> Tensor:
    """``x * 2**exponent`` exactly, in two factors (one could overflow: 2**190)."""
    half = torch.div(exponent, 2, rounding_mode="floor")
    one = torch.ones(exponent.shape, dtype=x.dtype, device=x.device)
    return x * torch.ldexp(one, half) * torch.ldexp(one, exponent - half)


def _square_safe(key: Tensor, query: Tensor, lengths: Tensor) -> Tuple[Tensor, Tensor]:
    """Keys and queries whose every target's scores have a bound within
    :data:`SQUARE_EXPONENTS`: ``|q_j| max_i |k_i|`` (Cauchy-Schwarz, ``i`` over the real
    units) when every one is within; else rescaled (:func:`_rescaled`)."""
    t = key.size(2)
    real_keys = key
    if bool((lengths < t).any()):  # padded keys may be anything: not in the bound
        real_keys = key * (torch.arange(t, device=key.device).view(1, 1, -1, 1) <
                           lengths.view(-1, 1, 1, 1)).to(key.dtype)
    key_max = torch.linalg.vector_norm(real_keys, dim=-1, keepdim=True).amax(2, keepdim=True)
    bound = torch.linalg.vector_norm(query, dim=-1, keepdim=True) * key_max  # [B, H, T, 1]
    low, high = (2.0 ** e for e in SQUARE_EXPONENTS)
    # (a zero bound: a zero row, or one whose squares underflowed in the norm)
    if not bool(((bound >= high) | (bound < low)).any()):
        return key, query
    return _rescaled(real_keys, query)


def _rescaled(key: Tensor, query: Tensor) -> Tuple[Tensor, Tensor]:
    """Keys (padded ones zero) brought to ``max |k| < 1`` per (sample, head), then queries
    per target to ``D max |q_j| < 2**SQUARE_EXPONENTS[1]``, by exact powers of two; from
    the largest entries, which cannot underflow as norms can."""
    _, e = torch.frexp(key.abs().amax((2, 3), keepdim=True))  # max = f * 2**e, f in [.5, 1)
    key = _times_power_of_two(key, -e)
    _, e = torch.frexp(query.abs().amax(-1, keepdim=True) * key.size(-1))  # >= every |score|
    return key, _times_power_of_two(query, SQUARE_EXPONENTS[1] - e)


def _relu2_squares(scores: Tensor, mask) -> Tuple[Tensor, Tensor]:
    """``(r, total)``: the squared-ReLU terms of a fresh block of scores below
    :data:`SQUARE_EXPONENT` (:func:`_square_safe`), in place, and their row sums (1 for a
    target without an edge); the weights are ``r / total``."""
    # (masked before squaring: scores of padded sources may be large, never inf x 0)
    _BlockScores.apply(scores.clamp_min_(0.0), mask).square_()
    total = scores.sum(-1, keepdim=True)
    return scores, total.masked_fill_(total <= 0, 1.0)


class _BlockScores:
    """The scores ``q_j . k_i`` of blocks of a layer, from its augmented keys and queries,
    and the allowed pairs of the blocks.

    With ``cut`` (squared-ReLU graphs without a window) the keys of padded units are
    zeroed once (score 0: never an edge) and only a block's diagonal part, where the order
    cuts, is masked per block; padded targets are the caller's to drop. Otherwise every
    block is masked whole."""

    def __init__(self, key: Tensor, query: Tensor, dtype: torch.dtype, copy_keys: bool,
                 lengths: Tensor, order: UnitOrder, cut: bool,
                 window: Optional[int] = None):
        # copy_keys: keys transposed once into [B, H, D, T], on which the block products
        # run about 10% faster; without, the products (and so the graphs) are bit for bit
        # those of emission's, which multiplies by the transposed view
        keys_t = key.to(dtype).transpose(-1, -2)
        t = key.size(2)
        self.padded = bool((lengths < t).any())
        if cut and self.padded:
            real = torch.arange(t, device=key.device) < lengths.view(-1, 1, 1, 1)
            keys_t = keys_t * real.to(dtype)
        self.keys_t = keys_t.contiguous() if copy_keys else keys_t
        self.queries = query.to(dtype)
        self.lengths, self.order, self.cut, self.window = lengths, order, cut, window

    def block(self, b0: int, b1: int, j0: int, j1: int, i0: int, i1: int) -> Tensor:
        """``[b1 - b0, H, j1 - j0, i1 - i0]`` scores, a new tensor."""
        return self.queries[b0:b1, :, j0:j1] @ self.keys_t[b0:b1, :, :, i0:i1]

    def mask(self, b0: int, b1: int, j0: int, j1: int, i0: int, i1: int):
        """What :meth:`apply` multiplies a block by: ``(first column, 0 / 1 mask)``."""
        dtype = self.queries.dtype
        if not self.cut:
            return 0, _allowed_block(self.order, j0, j1, i0, i1, self.lengths[b0:b1],
                                     self.window).to(dtype)
        # forward: every source before j0 is allowed; backward: every source from j1 on
        c0, c1 = (j0 - i0, i1 - i0) if self.order.direction == "forward" else \
            (0, min(j1, i1) - i0)
        j = torch.arange(j0, j1, device=self.lengths.device).view(-1, 1)
        i = torch.arange(i0 + c0, i0 + c1, device=self.lengths.device).view(1, -1)
        return c0, self.order.allowed(j, i).to(dtype)

    @staticmethod
    def apply(scores: Tensor, mask) -> Tensor:
        """``scores`` (non-negative) times the mask, in place."""
        c0, ones = mask
        scores[..., c0:c0 + ones.size(-1)].mul_(ones)
        return scores


def _walk(num_seqs: int, heads: int, t: int, order: UnitOrder, window: Optional[int],
          block_scores: int):
    """``(b0, b1, j0, j1, i0, i1)`` of every block (samples, targets, their sources), each
    of at most ``block_scores`` scores."""
    targets = min(t, MIN_BLOCK_TARGETS)
    group = max(1, min(num_seqs, block_scores // max(1, heads * t * targets)))
    tile = max(1, min(t, block_scores // max(1, group * heads * t)))
    for b0 in range(0, num_seqs, group):
        for j0 in range(0, t, tile):
            j1 = min(t, j0 + tile)
            yield (b0, min(num_seqs, b0 + group), j0, j1,
                   *_source_range(order, j0, j1, t, window))


def pruned_graph_edges(layers: Sequence[Tuple[Tensor, Tensor]], lengths: Tensor, *,
                       order: UnitOrder, normalization: str = "relu2",
                       heads: Optional[Sequence[int]] = None, merge: Optional[str] = None,
                       top_k: Optional[int] = None, min_weight: Optional[float] = None,
                       window: Optional[int] = None,
                       block_scores: Optional[int] = None) -> PrunedEdges:
    r"""The pruned edges of graph layers given by their keys and queries, computed block
    by block of targets: each block's graphs (paper Eq. 1) are normalised, merged and
    pruned (:func:`prune_rows`) before the next, so memory is the edges kept plus one
    block of ``block_scores`` scores.

    Args:
        layers: per graph layer the augmented ``[B, H, T, D]`` (keys, queries) whose inner
            products are the scores (:meth:`glomo_pyg.nn.GraphScorer.augmented`), bounded
            as emission bounds them (:func:`glomo_pyg.kernels.bounded_keys_queries`;
            softmax: not rescaled).
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
        block_scores: scores per block (default :data:`BLOCK_SCORES`).

    Returns ``(sample, relation, target, source, weight)`` sorted in that order; targets
    and sources are positions within their sample, weights float32 (float64 inputs:
    float64).
    """
    b, h, t, _ = layers[0][0].shape
    heads = list(range(h)) if heads is None else list(heads)
    dtype = torch.promote_types(layers[0][0].dtype, torch.float32)
    # every head scored, the selected ones kept: products bit for bit those of emission's
    cut = normalization == "relu2" and window is None
    scorers = [_BlockScores(k, q, dtype, False, lengths, order, cut, window)
               for k, q in layers]
    kept = None if len(heads) == h else heads  # (None: no selection, no copy)
    parts: List[PrunedEdges] = []
    with torch.autocast(lengths.device.type, enabled=False):
        for block in _walk(b, h, t, order, window, block_scores or BLOCK_SCORES):
            parts += _block_edges(scorers, block, kept, len(heads), normalization, merge,
                                  top_k, min_weight)
    relations = 1 if merge is not None else len(layers) * len(heads)
    return _joined_edges(parts, lengths if cut and scorers[0].padded else None, relations)


def _block_graphs(scorer: _BlockScores, block: Tuple[int, int, int, int, int, int], mask,
                  heads: Optional[List[int]], normalization: str) -> Tensor:
    """``[b1 - b0, H, tj, ti]`` normalised graphs of one layer's block (``heads``: kept)."""
    scores = scorer.block(*block)
    if heads is not None:  # (None: every head)
        scores = scores[:, heads]
    if normalization == "relu2":
        terms, total_terms = _relu2_terms(scores, mask)
        return terms.div_(total_terms)
    return normalise_scores(scores, mask[1] > 0, normalization)[0]


def _block_edges(scorers: Sequence[_BlockScores], block: Tuple[int, int, int, int, int, int],
                 heads: Optional[List[int]], per_layer: int, normalization: str,
                 merge: Optional[str], top_k: Optional[int],
                 min_weight: Optional[float]) -> List[PrunedEdges]:
    """The pruned edges of one block of :func:`_walk`, per (layer, head) or merged."""
    b0, _, j0, _, i0, _ = block
    mask = scorers[0].mask(*block)
    parts: List[PrunedEdges] = []
    total = None
    for l, scorer in enumerate(scorers):  # (every head is scored)
        g = _block_graphs(scorer, block, mask, heads, normalization)
        if merge is None:
            s, r, tgt, src, w = prune_rows(g, top_k, min_weight)
            parts.append((s + b0, r + l * per_layer, tgt + j0, src + i0, w))
        else:
            total = g.sum(1, keepdim=True) if total is None else \
                total.add_(g.sum(1, keepdim=True))
    if merge is not None:
        assert total is not None  # (layers is not empty)
        if merge == "mean":
            total.div_(len(scorers) * per_layer)
        s, r, tgt, src, w = prune_rows(total, top_k, min_weight)
        parts.append((s + b0, r, tgt + j0, src + i0, w))
    return parts


def _joined_edges(parts: List[PrunedEdges], lengths: Optional[Tensor],
                  relations: int) -> PrunedEdges:
    """The blocks' edges joined and sorted by (sample, relation), padded targets' dropped."""
    sample, relation, target, source, weight = (torch.cat(p) for p in zip(*parts))
    if lengths is not None:  # padded targets' rows were scored too: drop them
        real = target < lengths[sample]
        sample, relation, target, source, weight = (x[real] for x in
                                                    (sample, relation, target, source, weight))
    # blocks come target range by target range: a stable sort by (sample, relation) keeps
    # each relation's targets ascending
    key = sample * relations + relation
    if key.numel() > 1 and bool((key[1:] < key[:-1]).any()):
        key, perm = key.sort(stable=True)
        sample, relation, target, source, weight = (x[perm] for x in
                                                    (sample, relation, target, source, weight))
    return sample, relation, target, source, weight


def _times_values(weights: Tensor, values: Tensor) -> Tensor:
    """``[b, H, tj, ti] @ [b, H or 1, ti, C]``, values in any batch strides (the callers'
    head-major ones: no copy); shared values as one product per sample (a broadcast
    product would copy them once per head)."""
    b, h, tj, ti = weights.shape
    if values.size(1) == 1:
        return torch.bmm(weights.reshape(b, h * tj, ti), values[:, 0]).view(b, h, tj, -1)
    out = weights.new_empty(b, h, tj, values.size(-1))
    for i in range(b):  # (one product over [b, H] would copy head-major values)
        torch.bmm(weights[i], values[i], out=out[i])
    return out


def _propagated_block(scores: Tensor, mask, values: Tensor, normalization: str,
                      mean_heads: bool) -> Tensor:
    """``[b, H or 1, tj, C]``: one block's graphs (from its fresh ``scores``) times the
    values of its sources."""
    if normalization == "relu2":  # (sum_i r_ij v_i) / sum_i r_ij
        r, total = _relu2_squares(scores, mask)
        if mean_heads:
            return _times_values(r.div_(total).mean(1, keepdim=True), values)
        return _times_values(r, values).div_(total)
    g, _ = normalise_scores(scores, mask[1] > 0, normalization)
    return _times_values(g.mean(1, keepdim=True) if mean_heads else g, values)


def propagate_scores(key: Tensor, query: Tensor, values: Tensor, lengths: Tensor, *,
                     order: UnitOrder, normalization: str = "relu2",
                     window: Optional[int] = None, mean_heads: bool = False,
                     block_scores: Optional[int] = None) -> Tensor:
    r""":math:`\sum_i G_{ij} v_i` for every head and target, the graphs (paper Eq. 1) given
    by their augmented keys and queries (bounded, as for :func:`pruned_graph_edges`) and
    computed block of targets by block (never the whole ``T x T`` graph); no autograd
    (inference). ``mean_heads``: along the head-averaged graph
    :math:`\bar G = \frac{1}{H} \sum_h G^{(h)}` instead (one product with the values,
    not one per head).

    Shapes:
        key, query: ``[B, H, T, D]``; values: ``[B, H, T, C]`` per head or
        ``[B, 1, T, C]`` shared (``mean_heads``: shared only), in any strides; lengths:
        ``[B]``; returns ``[B, H, T, C]`` (``mean_heads``: ``[B, 1, T, C]``) in the dtype
        of ``values``, zero at padding and at targets without an edge, stored head-major
        (its ``transpose(0, 1)`` is contiguous).
    """
    b, h, t, _ = key.shape
    dtype = torch.promote_types(key.dtype, torch.float32)
    cut = normalization == "relu2" and window is None
    if normalization == "relu2":
        key, query = _square_safe(key.to(dtype), query.to(dtype), lengths)
    scorer = _BlockScores(key, query, dtype, True, lengths, order, cut, window)
    v = values.to(dtype)
    if mean_heads and v.size(1) != 1:
        raise ValueError("mean_heads propagates shared values ([B, 1, T, C])")
    heads = 1 if mean_heads else h
    # every (sample, target) is written by one block: no zero fill
    out = v.new_empty(heads, b, t, v.size(-1)).transpose(0, 1)
    with torch.autocast(lengths.device.type, enabled=False):
        for b0, b1, j0, j1, i0, i1 in _walk(b, h, t, order, window,
                                            block_scores or BLOCK_SCORES):
            out[b0:b1, :, j0:j1] = _propagated_block(
                scorer.block(b0, b1, j0, j1, i0, i1), scorer.mask(b0, b1, j0, j1, i0, i1),
                v[b0:b1, :, i0:i1], normalization, mean_heads)
    if cut and scorer.padded:  # padded targets' rows were scored too: zero them
        real = torch.arange(t, device=out.device) < lengths.view(-1, 1)
        out.mul_(real.view(b, 1, t, 1).to(dtype))
    return out.to(values.dtype)
