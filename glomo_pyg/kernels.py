"""Kernels behind the GLoMo layers (no modules, no state).

Two operations carry all the arithmetic of the library:

* :func:`latent_graph_edges` turns per-head keys and queries into the pruned,
  column-normalised graphs of paper Eq. 1, emitted as target-sorted edge lists.
  It works block by block (never more than ``block_size`` dense scores per
  head at a time) and its backward recomputes scores block by block, so memory
  is O(E + block) in training as well as in inference.
* :func:`weighted_spmm` multiplies a sparse row-sorted matrix by dense
  features as one CSR spmm, with gradients to both the edge weights (a sampled
  dense-dense product) and the features, never materialising ``[E, C]``
  messages.

Orientation (used everywhere in glomo_pyg): ``G[i, j]`` is the weight of the
edge from source ``i`` to target ``j``; each target's incoming weights sum to 1
or it has no incoming edge at all.
"""
from __future__ import annotations

import math
import warnings
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from glomo_pyg.ordering import DIRECTIONS, SequenceOrder
from glomo_pyg.sequences import first_failure

NORMALIZATIONS = ("relu2", "softmax")


# The most (head, source, target) pairs one graph layer of one call may hold (paper Eq. 1
# scores every allowed pair, and trained graphs keep 40-85% of them): in the sparse layout
# an upper bound on the edges (28 bytes each: int64 ids and head, fp32 weight; 2**27 edges
# are 3.5 GiB), in the dense layout the B * H * T^2 weights of a block (4 bytes each; about
# six blocks' worth while training). Checked from host-side sizes before anything is
# allocated; raise it where the memory is there (docs/design.md, "Limits").
MAX_GRAPH_PAIRS = 1 << 27


def graph_pairs(layout: str, num_sequences: int, num_nodes: int, max_len: int, heads: int,
                include_self: bool = False) -> int:
    """Upper bound on what one graph layer holds in ``layout``: ``'dense'``, the
    ``B * H * T^2`` block weights; otherwise ``H`` times the allowed pairs, at most
    ``N (T - 1) / 2`` (``N (T + 1) / 2`` with ``include_self``) for ``N`` units in sequences
    of at most ``T`` units, exact when every sequence has ``T``. Host integers only: no
    device sync."""
    if layout == "dense":
        return num_sequences * heads * max_len * max_len
    return heads * num_nodes * max(0, max_len - 1 + 2 * int(include_self)) // 2


def check_graph_size(layout: str, num_sequences: int, num_nodes: int, max_len: int,
                     heads: int, include_self: bool = False, hint: str = "") -> None:
    """``ValueError`` saying what to do when one graph layer of a batch could exceed
    :data:`MAX_GRAPH_PAIRS` in ``layout`` (see :func:`graph_pairs`)."""
    pairs = graph_pairs(layout, num_sequences, num_nodes, max_len, heads, include_self)
    if pairs <= MAX_GRAPH_PAIRS:
        return
    longest = math.isqrt(2 * MAX_GRAPH_PAIRS // max(1, heads))  # one sequence, sparse layout
    size = (f"{pairs * 28 / 2**30:.1f} GiB of edge lists" if layout != "dense" else
            f"{pairs * 4 / 2**30:.1f} GiB per dense block")
    raise ValueError(
        f"one graph layer of this batch could hold {pairs:,} (head, source, target) pairs in "
        f"the {layout} layout ({heads} heads, {num_sequences} sequences, {num_nodes} units, the "
        f"longest {max_len}; up to {size}), more than glomo_pyg.kernels.MAX_GRAPH_PAIRS = "
        f"{MAX_GRAPH_PAIRS:,}. {hint}Split long sequences into chunks (one sequence of at most "
        f"about {longest} units fits), use smaller batches, or use layout='fused' "
        f"(FlexAttention, memory linear in the length; inference, or training on a GPU); or "
        f"raise glomo_pyg.kernels.MAX_GRAPH_PAIRS where the memory is there.")


def _block_plan(num_seqs: int, max_len: int, block_size: int) -> Tuple[int, int]:
    """Sequences per block and targets per block so a block holds at most
    ``block_size`` scores. Target tiling only happens one sequence at a time,
    which keeps emission sorted by flat target id without a global sort."""
    if max_len * max_len <= block_size:
        return max(1, min(num_seqs, block_size // (max_len * max_len))), max_len
    return 1, max(1, block_size // max_len)


def _allowed(j0: int, j1: int, i0: int, i1: int, lengths: Tensor, direction: str,
             include_self: bool) -> Tensor:
    """``[Bg, tj, ti]`` mask of allowed (target j, source i) pairs in a block."""
    return SequenceOrder(direction, include_self).block_mask(j0, j1, i0, i1, lengths)


# Keys and queries are rescaled by powers of two (exact: no rounding) so that each key of a
# (sequence, head) and each query has its largest entry below 2**SAFE_EXPONENT. Scores are
# then below D * 2**(2 * SAFE_EXPONENT), finite in fp32 for any head width D < 2**28, however
# large the model's keys and queries grow (e.g. a diverging embedding): the products of two
# finite fp32 numbers would otherwise overflow to inf and inf - inf = NaN. The squared-ReLU
# graphs are invariant under these factors (they cancel in the column normalisation); the
# softmax is computed from the rescaled scores with the factors put back after subtracting
# each target's maximum. Ordinary magnitudes (below 2**50, about 1e15) are never rescaled,
# so their graphs are bit for bit what they were without it.
SAFE_EXPONENT = 50


def _safe_scale(x: Tensor, dims: Tuple[int, ...]) -> Tensor:
    """Power-of-two factors <= 1 (no gradient) that bring the largest ``|x|`` over ``dims``
    below ``2**SAFE_EXPONENT``; 1 where it already is."""
    m = x.detach().abs().amax(dim=dims, keepdim=True)
    _, exponent = torch.frexp(m)  # m = f * 2**exponent with f in [0.5, 1)
    return torch.ldexp(torch.ones_like(m), (SAFE_EXPONENT - exponent).clamp(max=0))


def _safe_scales(key: Tensor, query: Tensor) -> Tuple[Tensor, Tensor]:
    """Factors ``[B, H, 1, 1]`` for the keys (one per sequence and head: all sources of a
    target must share one) and ``[B, H, T, 1]`` for the queries (one per target)."""
    return _safe_scale(key, (2, 3)), _safe_scale(query, (3,))


def bounded_keys_queries(key: Tensor, query: Tensor) -> Tuple[Tensor, Tensor]:
    """Keys and queries rescaled (exactly, by powers of two, see :data:`SAFE_EXPONENT`)
    so that no score overflows. Squared-ReLU graphs of the result are those of the inputs
    (the factors cancel); gradients flow through the constant factors. Softmax graphs are
    *not* invariant: use it for ``normalization='relu2'`` only."""
    ck, cq = _safe_scales(key, query)
    return key * ck.to(key.dtype), query * cq.to(query.dtype)


def _normalise(scores: Tensor, allowed: Tensor, normalization: str,
               unscale: Optional[Tuple[Tensor, Tensor]] = None):
    """Column-normalised weights of one block (last dim = sources).

    Squared ReLU is computed relative to each target's largest score, which is the same
    quantity (the ratio cancels) but can neither overflow nor turn a non-empty column into
    0/0. ``unscale``: the inverse ``(query, key)`` factors of scores computed from rescaled
    keys and queries (:func:`_safe_scales`), which the softmax needs (the squared ReLU is
    invariant). Returns the weights and what backward needs.
    """
    if normalization == "relu2":
        a = torch.where(allowed, scores.clamp_min(0.0), torch.zeros((), device=scores.device))
        m = a.amax(-1, keepdim=True)
        u = a / torch.where(m > 0, m, torch.ones((), device=m.device))
        r = u * u
        d = r.sum(-1, keepdim=True)
        g = r / torch.where(d > 0, d, torch.ones((), device=d.device))
        return g, (u, m, d)
    masked = scores.masked_fill(~allowed, float("-inf"))
    if unscale is not None:  # softmax(s) = softmax((s' - max s') / (c_q c_k)), s' = c_q c_k s
        top = masked.detach().amax(-1, keepdim=True)
        top = torch.where(torch.isfinite(top), top, torch.zeros((), device=top.device))
        masked = (masked - top) * unscale[0] * unscale[1]  # one factor at a time: no inf
    g = torch.softmax(masked, dim=-1)
    g = torch.where(allowed, g, torch.zeros((), device=g.device))  # rows without sources: NaN -> 0
    return g, None


def _block_ranges(direction: str, j0: int, j1: int, max_len: int) -> Tuple[int, int]:
    """Source range that can feed targets ``[j0, j1)``."""
    return (0, j1) if direction == "forward" else (j0, max_len)


# Blocks that batch several heads are capped at this many scores: bigger blocks no longer
# amortise Python overhead and lose to cache misses (side-by-side measurement on CPU,
# benchmarks/results/speed.md, "emission blocks").
HEAD_BATCH_SCORES = 1 << 19


def _head_plan(num_seqs: int, heads: int, max_len: int, block_size: int):
    """Head ranges and the (sequences, targets) per block. Short sequences put all heads
    into one block (one matmul instead of a Python loop over heads) when at least two
    sequences' worth fit in ``HEAD_BATCH_SCORES`` scores; otherwise one head at a time."""
    per_seq = heads * max_len * max_len  # all heads of one sequence
    target = min(block_size, HEAD_BATCH_SCORES)
    if heads > 1 and 2 * per_seq <= target:
        group = max(1, min(num_seqs, target // per_seq))
        return [(0, heads)], group, max_len
    group, tile = _block_plan(num_seqs, max_len, block_size)
    return [(h, h + 1) for h in range(heads)], group, tile


def _blocks(num_seqs: int, heads: int, lengths_list: List[int], direction: str, block_size: int):
    """``(h0, h1, b0, b1, j0, j1, i0, i1)`` of every block, in emission order."""
    max_len = max(lengths_list, default=0)
    head_ranges, group, tile = _head_plan(num_seqs, heads, max_len, block_size)
    for h0, h1 in head_ranges:
        for b0 in range(0, num_seqs, group):
            b1 = min(num_seqs, b0 + group)
            group_len = max(lengths_list[b0:b1], default=0)
            for j0 in range(0, group_len, tile):
                j1 = min(group_len, j0 + tile)
                yield (h0, h1, b0, b1, j0, j1, *_block_ranges(direction, j0, j1, group_len))


def _scaled(key: Tensor, query: Tensor, dtype: torch.dtype):
    """Keys and queries in ``dtype`` rescaled by :func:`_safe_scales`, and the inverse
    ``(query, key)`` factors (exact powers of two), needed by the softmax and by the
    chain rule back to the unscaled inputs."""
    k, q = key.to(dtype), query.to(dtype)
    ck, cq = _safe_scales(k, q)
    return k * ck, q * cq, (1.0 / cq, 1.0 / ck)


def _block_unscale(unscale, b0: int, b1: int, h0: int, h1: int, j0: int, j1: int):
    return unscale[0][b0:b1, h0:h1, j0:j1], unscale[1][b0:b1, h0:h1]


class _LatentGraphEdges(torch.autograd.Function):
    @staticmethod
    def forward(ctx, key: Tensor, query: Tensor, lengths: Tensor, ptr: Tensor, sizes: List[int],
                direction: str, include_self: bool, normalization: str, block_size: int):
        num_seqs, heads, _, _ = key.shape
        dtype = torch.promote_types(key.dtype, torch.float32)  # fp32 for half types
        k, q, unscale = _scaled(key, query, dtype)
        blocks = list(_blocks(num_seqs, heads, sizes, direction, block_size))
        # per head, its edges of every block, in block order: (block, source, target, weight);
        # one nonzero per (block, head), so each head's edge count is known without a sync
        segments: List[List[Tuple[int, Tensor, Tensor, Tensor]]] = [[] for _ in range(heads)]
        with torch.autocast(key.device.type, enabled=False):
            for n, (h0, h1, b0, b1, j0, j1, i0, i1) in enumerate(blocks):
                scores = q[b0:b1, h0:h1, j0:j1] @ k[b0:b1, h0:h1, i0:i1].transpose(-1, -2)
                allowed = _allowed(j0, j1, i0, i1, lengths[b0:b1], direction, include_self)
                g, _ = _normalise(scores, allowed.unsqueeze(1), normalization,
                                  _block_unscale(unscale, b0, b1, h0, h1, j0, j1))
                for r in range(h1 - h0):
                    g_r = g[:, r]
                    b, j, i = (g_r > 0).nonzero(as_tuple=True)  # prune exact zeros only
                    offset = ptr[b0 + b]
                    segments[h0 + r].append((n, offset + (i0 + i), offset + (j0 + j),
                                             g_r[b, j, i]))
        where: List[List[Tuple[int, int]]] = [[] for _ in blocks]  # (start, count) per block
        parts, start = [], 0
        for h, segs in enumerate(segments):  # (head, target) order: head by head
            for n, s_, t_, w_ in segs:
                where[n].append((start, s_.numel()))
                start += s_.numel()
                parts.append((s_, t_, w_, torch.full_like(s_, h)))
        if parts:
            src, tgt, edge_weight, edge_head = (torch.cat(t) for t in zip(*parts))
        else:
            src = tgt = edge_head = torch.empty(0, dtype=torch.long, device=key.device)
            edge_weight = torch.empty(0, dtype=dtype, device=key.device)
        edge_index = torch.stack([src, tgt])
        ctx.save_for_backward(key, query, lengths, ptr, edge_index, edge_head)
        ctx.blocks, ctx.where = blocks, where
        ctx.config = (direction, include_self, normalization)
        ctx.mark_non_differentiable(edge_index, edge_head)
        return edge_index, edge_weight, edge_head

    @staticmethod
    @once_differentiable
    def backward(ctx, _grad_index, grad_weight, _grad_head):
        key, query, lengths, ptr, edge_index, edge_head = ctx.saved_tensors
        direction, include_self, normalization = ctx.config
        if grad_weight is None:
            return (None,) * 9
        dtype = torch.promote_types(key.dtype, torch.float32)
        k, q, unscale = _scaled(key, query, dtype)
        dk, dq = torch.zeros_like(k), torch.zeros_like(q)
        grad_weight = grad_weight.to(dtype)
        src, tgt = edge_index
        with torch.autocast(key.device.type, enabled=False):
            for n, (h0, h1, b0, b1, j0, j1, i0, i1) in enumerate(ctx.blocks):
                spans = [(a, c) for a, c in ctx.where[n] if c]
                if not spans:  # no edge: no gradient reaches this block
                    continue
                kb, qb = k[b0:b1, h0:h1, i0:i1], q[b0:b1, h0:h1, j0:j1]
                allowed = _allowed(j0, j1, i0, i1, lengths[b0:b1], direction, include_self)
                block_unscale = _block_unscale(unscale, b0, b1, h0, h1, j0, j1)
                g, aux = _normalise(qb @ kb.transpose(-1, -2), allowed.unsqueeze(1),
                                    normalization, block_unscale)
                sel = slice(spans[0][0], spans[0][0] + spans[0][1]) if len(spans) == 1 else \
                    torch.cat([torch.arange(a, a + c, device=src.device) for a, c in spans])
                e_src, e_tgt = src[sel], tgt[sel]
                seq = torch.searchsorted(ptr, e_tgt, right=True) - 1
                grad_g = torch.zeros_like(g)
                grad_g[seq - b0, edge_head[sel] - h0, e_tgt - ptr[seq] - j0,
                       e_src - ptr[seq] - i0] = grad_weight[sel]
                centred = grad_g - (grad_g * g).sum(-1, keepdim=True)
                if normalization == "relu2":
                    u, m, d = aux
                    scale = m * d
                    grad_s = 2.0 * u / torch.where(scale > 0, scale, torch.ones((), device=scale.device)) * centred
                else:
                    grad_s = g * centred
                    if block_unscale is not None:  # d/ds' of softmax((s' - max) / (c_q c_k))
                        grad_s = grad_s * block_unscale[0] * block_unscale[1]
                # gradients with respect to the rescaled keys and queries k', q' ...
                dq[b0:b1, h0:h1, j0:j1] += grad_s @ kb
                dk[b0:b1, h0:h1, i0:i1] += grad_s.transpose(-1, -2) @ qb
        dk, dq = dk / unscale[1], dq / unscale[0]  # ... and to k, q: k' = c_k k, q' = c_q q
        return dk.to(key.dtype), dq.to(query.dtype), None, None, None, None, None, None, None


def _check_emission_args(key: Tensor, query: Tensor, direction: str, normalization: str,
                         block_size: int = 1, finite: bool = False) -> None:
    """The arguments of the public emission functions; with ``finite`` also the values
    of the keys and queries (a device sync: finite ones of any magnitude are safe, see
    :data:`SAFE_EXPONENT`, non-finite ones have no meaningful graph)."""
    shapes = key.dim() == 4 and key.shape == query.shape
    if direction not in DIRECTIONS or normalization not in NORMALIZATIONS or not shapes or \
            block_size < 1 or (finite and not bool(torch.isfinite(key).all() &
                                                   torch.isfinite(query).all())):
        raise ValueError(f"direction must be one of {DIRECTIONS}, normalization one of "
                         f"{NORMALIZATIONS}, key and query both [B, H, T, D] without NaN or Inf "
                         f"and block_size positive; got {direction!r}, {normalization!r}, "
                         f"{tuple(key.shape)}, {tuple(query.shape)}, {block_size}")


def latent_graph_edges(key: Tensor, query: Tensor, lengths: Tensor, ptr: Tensor, *,
                       direction: str = "forward", include_self: bool = False,
                       normalization: str = "relu2", block_size: int = 1 << 22,
                       check: bool = True, sizes: Optional[Sequence[int]] = None
                       ) -> Tuple[Tensor, Tensor, Tensor]:
    r"""Emit the pruned, normalised graphs of paper Eq. 1 as edge lists.

    With :math:`s_{ij} = k_i^\top q_j` (a bias is folded into ``key``/``query``
    by the caller) and the allowed sources :math:`\mathcal{A}(j)` of target
    :math:`j` (``i < j`` forward, ``i > j`` backward, ``=`` admitted with
    ``include_self``; same sequence, not padding):

    .. math::
        G_{ij} = \frac{\mathrm{ReLU}(s_{ij})^2}
                 {\sum_{i' \in \mathcal{A}(j)} \mathrm{ReLU}(s_{i'j})^2}

    or a softmax over :math:`\mathcal{A}(j)` for ``normalization='softmax'``.
    Only strictly positive weights become edges (never NaN). Computed in fp32 (fp64 for
    fp64 inputs) from keys and queries rescaled exactly where they are huge
    (:data:`SAFE_EXPONENT`). NaN or Inf keys or queries raise ``ValueError`` unless
    ``check=False`` (for inputs the library built).

    Args:
        key, query: ``[B, H, T, D]`` padded per-head keys and queries.
        lengths: ``[B]`` valid length of each sequence.
        ptr: ``[B + 1]`` flat offset of each sequence (``ptr[b] + t`` is the
            flat node id of position ``t`` of sequence ``b``).
        block_size: at most this many dense scores are held per block.
        sizes: ``lengths`` as host integers (:attr:`SequenceBatch.sizes`), which plan
            the blocks; read from ``lengths`` (a device sync) when not given.

    Returns:
        ``(edge_index [2, E], edge_weight [E], edge_head [E])`` sorted by
        ``(head, target, source)``; gradients flow from ``edge_weight`` to
        ``key`` and ``query``.
    """
    _check_emission_args(key, query, direction, normalization, block_size, finite=check)
    sizes = lengths.tolist() if sizes is None else list(sizes)
    return _LatentGraphEdges.apply(key, query, lengths, ptr, sizes, direction, include_self,
                                   normalization, block_size)


def latent_graph_dense(key: Tensor, query: Tensor, lengths: Tensor, *,
                       direction: str = "forward", include_self: bool = False,
                       normalization: str = "relu2", check: bool = True) -> Tensor:
    r"""The graphs of :func:`latent_graph_edges` as dense per-sequence blocks.

    Same arithmetic (fp32, overflow-safe rescaling, relative to each target's largest
    score), but the
    result is ``[B, H, T, T]`` with ``[b, h, i, j] = G_ij`` (zero at padding,
    at disallowed and at pruned pairs) and gradients come from plain autograd,
    which keeps ``O(B H T^2)`` intermediates: the dense layout, for short
    sequences and dense graphs. NaN or Inf keys or queries raise ``ValueError``
    unless ``check=False`` (the test costs a device sync).
    """
    _check_emission_args(key, query, direction, normalization, finite=check)
    dtype = torch.promote_types(key.dtype, torch.float32)
    t = key.size(2)
    with torch.autocast(key.device.type, enabled=False):
        k, q, unscale = _scaled(key, query, dtype)  # constant factors: autograd passes them
        scores = q @ k.transpose(-1, -2)  # [B, H, T(j), T(i)]
        allowed = _allowed(0, t, 0, t, lengths, direction, include_self).unsqueeze(1)
        g, _ = _normalise(scores, allowed, normalization, unscale)
    return g.transpose(-1, -2)


# Under a bfloat16 autocast region the keep-alive scan and the fused propagation
# (glomo_pyg.flex) run their T x T products in bfloat16 (tensor cores); False keeps both in
# float32 as before, e.g. to time one against the other.
FOLLOW_AUTOCAST = True


def autocast_half_dtype(device_type: str) -> Optional[torch.dtype]:
    """``torch.bfloat16`` inside an enabled bfloat16 autocast region on ``device_type``
    (and :data:`FOLLOW_AUTOCAST`), else ``None``. A float16 region gives ``None``: float16
    holds at most 65504, less than the scores of ordinary keys and queries may reach and
    far less than the ``2**SAFE_EXPONENT`` that rescaled keys may hold, while bfloat16 has
    float32's range. No device sync."""
    if FOLLOW_AUTOCAST and torch.is_autocast_enabled(device_type) and \
            torch.get_autocast_dtype(device_type) == torch.bfloat16:
        return torch.bfloat16
    return None


def _column_max_scan(k: Tensor, q: Tensor, lengths: Tensor, direction: str,
                     include_self: bool, tile: int) -> Tuple[Tensor, Tensor]:
    """``(best, arg)``, both ``[B, H, T]``: each target's largest allowed score in the
    dtype of ``k`` and ``q`` (``-inf`` without allowed sources) and its first arg-max
    source, scanned tile by tile without autograd."""
    t = k.size(2)
    best, arg = [], []
    for j0 in range(0, t, tile):
        j1 = min(t, j0 + tile)
        i0, i1 = _block_ranges(direction, j0, j1, t)  # the sources that can feed
        scores = q[:, :, j0:j1] @ k[:, :, i0:i1].transpose(-1, -2)  # [B, H, tj, ti]
        allowed = _allowed(j0, j1, i0, i1, lengths, direction, include_self)
        # two passes over the tile (fill in place, then max); one fused pass would need
        # a compiled or custom kernel
        top = scores.masked_fill_(~allowed.unsqueeze(1), float("-inf")).max(-1)
        best.append(top.values)
        arg.append(top.indices + i0)
    return torch.cat(best, -1), torch.cat(arg, -1)


def column_max_scores(key: Tensor, query: Tensor, lengths: Tensor, *,
                      direction: str = "forward", include_self: bool = False,
                      block_size: int = 1 << 22,
                      scan_dtype: Optional[torch.dtype] = None) -> Tensor:
    r"""Each target's largest score over its allowed sources,
    :math:`\max_{i \text{ allowed}} s_{ij}` with :math:`s_{ij} = k_i^\top q_j`, as
    ``[B, H, T]`` (``-inf`` for targets without allowed sources and at padding). A column
    of a squared-ReLU graph has an edge iff this is positive.

    Targets are scanned without autograd in tiles of at most ``block_size`` scores per
    head; only the arg-max pairs' scores are recomputed with autograd, so the backward
    keeps O(B H T D) (``benchmarks/keep_alive_speed.py``); ties send the gradient to the
    first source.

    ``scan_dtype``: the dtype of the scan; ``None`` follows autocast
    (:func:`autocast_half_dtype`). A float32 scan returns its maxima exactly; a bfloat16
    scan only picks the arg-max, whose float32 score is returned (below the exact maximum
    only at near-ties, by about :math:`3 \cdot 2^{-8} \max_i \sum_d |k_{id} q_{jd}|`).

    Shapes:
        key, query: ``[B, H, T, D]``; lengths: ``[B]``; returns ``[B, H, T]`` in
        float32 (float64 for float64 inputs).
    """
    _check_emission_args(key, query, direction, "relu2")
    dtype = torch.promote_types(key.dtype, torch.float32)
    b, h, t, d = key.shape
    if t == 0:
        return key.new_empty(b, h, 0, dtype=dtype)
    scan = scan_dtype or autocast_half_dtype(key.device.type) or dtype
    # Per head, as block_size means everywhere: tiles of a few targets each made a pixel
    # pretraining step (B 64, H 8, T 1024) launch 128 tiny float32 matmuls per layer and
    # direction, 10-20% of its GPU time (benchmarks/results/speed.md, the GPU profile).
    # A narrower scan dtype takes proportionally more scores in the same bytes.
    tile = max(1, block_size // max(1, b * t)) * max(1, dtype.itemsize // scan.itemsize)
    with torch.autocast(key.device.type, enabled=False):
        k, q = key.to(dtype), query.to(dtype)
        # The maxima and their sources without autograd: differentiating the tiled
        # T x T scores through amax kept every tile for the backward pass (O(B H T^2)
        # memory and most of a pixel pretraining step's time).
        with torch.no_grad():
            best, arg = _column_max_scan(k.to(scan), q.to(scan), lengths, direction,
                                         include_self, tile)
            best = best.to(dtype)
        exact_scan = scan.itemsize >= dtype.itemsize
        grad = torch.is_grad_enabled() and (key.requires_grad or query.requires_grad)
        if exact_scan and not grad:
            return best
        # the arg-max pair's score, recomputed (with autograd where needed) in O(B H T D)
        source = k.gather(2, arg.unsqueeze(-1).expand(b, h, t, d))
        score = (q * source).sum(-1)
        if exact_scan:  # the value stays exactly the scanned maximum; score carries the gradient
            score = best + (score - score.detach())
        return torch.where(torch.isfinite(best), score,
                           torch.full((), -float("inf"), dtype=dtype, device=key.device))


def dense_head_propagate(x: Tensor, adj: Tensor, ptr: Tensor, position: Tensor,
                         batch: Tensor) -> Tensor:
    r""":func:`head_propagate` over dense per-sequence blocks ``adj`` ``[B, H, T, T]``
    (``[b, h, i, j] = G_ij``): ``x`` is ``[N, C]`` (shared by all heads) or
    ``[H, N, C]``; returns ``[H, N, C]``. Batched matmuls over padded blocks."""
    b_, h_, t_, _ = adj.shape
    xs = x.unsqueeze(0) if x.dim() == 2 else x  # [H or 1, N, C]
    n, c = xs.size(1), xs.size(-1)
    a = adj.transpose(-1, -2).to(x.dtype)  # [B, H, T(j), T(i)]: a view, no copy
    if n == b_ * t_:  # every sequence has the full length: padding is a view
        padded = xs.reshape(xs.size(0), b_, t_, c).transpose(0, 1)  # [B, H or 1, T, C]
        return (a @ padded).transpose(0, 1).reshape(h_, n, c)
    padded = xs.new_zeros(b_, xs.size(0), t_, c)
    padded[batch, :, position] = xs.transpose(0, 1)  # [B, H or 1, T, C]
    return (a @ padded)[batch, :, position].transpose(0, 1)


_CSR_NOTICE_SEEN = False


def _csr(row_ptr: Tensor, col: Tensor, value: Tensor, size: Tuple[int, int]) -> Tensor:
    """A CSR matrix over indices validated at the door (invariant checks off: they cost
    a pass over the indices per product). CSR is only an internal vehicle for spmm
    here, so torch's one-time "beta" notice, raised at the first CSR tensor of the
    process, is silenced there, without a global warnings filter."""
    global _CSR_NOTICE_SEEN
    if _CSR_NOTICE_SEEN:
        return torch.sparse_csr_tensor(row_ptr, col, value, size, check_invariants=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly")
        out = torch.sparse_csr_tensor(row_ptr, col, value, size, check_invariants=False)
    _CSR_NOTICE_SEEN = True
    return out


def _row_ptr(row: Tensor, num_rows: int) -> Tensor:
    """CSR row pointers of sorted rows, in the rows' index dtype (CSR needs the
    pointers and the columns in one dtype)."""
    return torch._convert_indices_from_coo_to_csr(row, num_rows,
                                                  out_int32=row.dtype == torch.int32)


# The sparse product is a registered custom operator (opaque to torch.compile, which
# cannot trace sparse-tensor construction), with its backward as a second operator.
@torch.library.custom_op("glomo_pyg::weighted_spmm", mutates_args=())
def _spmm_op(row: Tensor, col: Tensor, weight: Tensor, x: Tensor, num_rows: int) -> Tensor:
    row_ptr = _row_ptr(row, num_rows)
    with torch.autocast(x.device.type, enabled=False):  # the dtype of x, as given
        return _csr(row_ptr, col, weight.to(x.dtype), (num_rows, x.size(0))) @ x


@_spmm_op.register_fake
def _(row, col, weight, x, num_rows):
    return x.new_empty(num_rows, x.size(1))


@torch.library.custom_op("glomo_pyg::weighted_spmm_backward", mutates_args=())
def _spmm_backward_op(grad_out: Tensor, row: Tensor, col: Tensor, weight: Tensor, x: Tensor,
                      num_rows: int, need_weight: bool, need_x: bool) -> Tuple[Tensor, Tensor]:
    with torch.autocast(x.device.type, enabled=False):  # backward may run inside autocast
        return _spmm_backward_impl(grad_out, row, col, weight, x, num_rows, need_weight, need_x)


# The backward works on row chunks: its sort, its transposed copy and its sampled product
# need about 60 bytes of scratch per edge of a chunk, so E is cut into up to
# BACKWARD_MAX_CHUNKS chunks of at least BACKWARD_MIN_CHUNK edges (scratch about E/16 * 60
# bytes instead of E * 60; the peak-memory target in benchmarks/results/speed.md).
BACKWARD_MIN_CHUNK, BACKWARD_MAX_CHUNKS = 1 << 16, 16


def _row_chunks(row_ptr: Tensor, num_edges: int) -> List[Tuple[int, int, int, int]]:
    """``(r0, r1, e0, e1)``: row ranges of about equal edge counts (whole rows)."""
    parts = max(1, min(BACKWARD_MAX_CHUNKS, num_edges // BACKWARD_MIN_CHUNK))
    chunk = -(-num_edges // parts)
    if parts == 1:
        return [(0, row_ptr.numel() - 1, 0, num_edges)]
    marks = torch.arange(1, parts, device=row_ptr.device, dtype=row_ptr.dtype) * chunk
    cuts = torch.searchsorted(row_ptr, marks).tolist()
    bounds = sorted(set([0] + cuts + [row_ptr.numel() - 1]))
    starts = row_ptr[torch.tensor(bounds, device=row_ptr.device)].tolist()
    return [(r0, r1, e0, e1) for r0, r1, e0, e1 in zip(bounds[:-1], bounds[1:], starts[:-1],
                                                     starts[1:]) if e1 > e0]


def _spmm_backward_impl(grad_out, row, col, weight, x, num_rows, need_weight, need_x):
    grad_out = grad_out.to(x.dtype).contiguous()
    grad_weight = torch.empty_like(weight) if need_weight else torch.zeros_like(weight)
    grad_x = torch.zeros_like(x)
    row_ptr = _row_ptr(row, num_rows)
    for r0, r1, e0, e1 in _row_chunks(row_ptr, row.numel()):
        r, c, w = row[e0:e1] - r0, col[e0:e1], weight[e0:e1]
        c0, c1 = int(c.min()), int(c.max()) + 1  # the columns this chunk touches
        c = c - c0
        g_out, x_part = grad_out[r0:r1], x[c0:c1]
        if need_x:
            # x's gradient is A^T @ grad_out. CPU and CUDA spmm want CSR, so the transposed
            # order comes from a stable sort of the chunk's columns.
            sorted_c, perm = torch.sort(c, stable=True)
            transposed = _csr(_row_ptr(sorted_c, c1 - c0), r[perm], w[perm].to(x.dtype),
                              (c1 - c0, r1 - r0))
            del sorted_c, perm
            grad_x[c0:c1] += transposed @ g_out
            del transposed
        if need_weight:
            # d out[r] / d w_e = x[col_e]: a sampled dense-dense product on the pattern.
            pattern = _csr(_row_ptr(r, r1 - r0), c, torch.zeros_like(w, dtype=x.dtype),
                           (r1 - r0, c1 - c0))
            grad_weight[e0:e1] = torch.sparse.sampled_addmm(
                pattern, g_out, x_part.t().contiguous(), beta=0.0).values().to(weight.dtype)
    return grad_weight, grad_x


@_spmm_backward_op.register_fake
def _(grad_out, row, col, weight, x, num_rows, need_weight, need_x):
    return torch.empty_like(weight), torch.empty_like(x)


def _spmm_setup_context(ctx, inputs, output):
    row, col, weight, x, num_rows = inputs
    ctx.save_for_backward(row, col, weight, x)
    ctx.num_rows = num_rows


def _spmm_backward(ctx, grad_out):
    row, col, weight, x = ctx.saved_tensors
    need_weight, need_x = ctx.needs_input_grad[2], ctx.needs_input_grad[3]
    grad_weight, grad_x = _spmm_backward_op(grad_out, row, col, weight, x, ctx.num_rows,
                                            need_weight, need_x)
    return (None, None, grad_weight if need_weight else None, grad_x if need_x else None, None)


_spmm_op.register_autograd(_spmm_backward, setup_context=_spmm_setup_context)


def spmm_unchecked(row: Tensor, col: Tensor, weight: Tensor, x: Tensor, num_rows: int) -> Tensor:
    """:func:`weighted_spmm` without the index checks, for indices that were validated
    where they entered the library (e.g. :class:`~glomo_pyg.LatentGraphs`)."""
    out_dtype = x.dtype
    if x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    if row.numel() == 0:
        return x.new_zeros(num_rows, x.size(1), dtype=out_dtype)
    # Autocast would recast the sparse product's operands (to bf16 on CPU, where no
    # sparse kernel exists for it): the product runs in the dtype of x, as given.
    with torch.autocast(x.device.type, enabled=False):
        return _spmm_op(row, col, weight, x, num_rows).to(out_dtype)


def weighted_spmm(row: Tensor, col: Tensor, weight: Tensor, x: Tensor, num_rows: int) -> Tensor:
    r"""``out[r] = sum_e [row_e = r] * weight_e * x[col_e]`` as one CSR spmm.

    ``row`` must be sorted ascending (edges emitted by glomo_pyg are). Gradients
    flow to ``weight`` and ``x``; peak memory is O(E + rows * C): no per-edge
    message tensor is formed in the forward or the backward pass. Half
    precision features on CPU are computed in fp32 (CPU sparse kernels lack
    them) and cast back. Indices out of range, unsorted rows or mismatched
    shapes raise ``ValueError`` (the sparse kernels would read out of bounds).
    """
    tensors = (row, col, weight, x)
    if not all(isinstance(t, Tensor) for t in tensors) or x.dim() != 2 or \
            not x.dtype.is_floating_point or row.dtype not in (torch.int32, torch.int64) or \
            col.dtype != row.dtype or row.dim() != 1 or not row.shape == col.shape == weight.shape:
        raise ValueError("x must be a floating-point [M, C] tensor and row, col and weight 1-D "
                         "with one entry per edge, row and col of one int32/int64 dtype; got "
                         + ", ".join(f"{t.dtype} {tuple(t.shape)}" if isinstance(t, Tensor)
                                     else type(t).__name__ for t in tensors))
    if row.numel():
        first_failure([(((row < 0) | (row >= num_rows)).any(),
                         f"row holds ids outside [0, {num_rows})"),
                       (((col < 0) | (col >= x.size(0))).any(),
                        f"col holds ids outside [0, {x.size(0)})"),
                       ((row[1:] < row[:-1]).any(), "row must be sorted ascending")])
    return spmm_unchecked(row, col, weight, x, num_rows)


def is_compiling() -> bool:
    """True while ``torch.compile`` traces the caller (checks that need a device sync are
    skipped then)."""
    return torch.compiler.is_compiling()


def finite_flag(t: Tensor) -> Tensor:
    """A 0-d tensor, finite exactly when every entry of ``t`` may be (no sync): the sum.
    A NaN or an infinity makes any float sum NaN or infinite, so a finite sum proves them
    absent in one pass; a non-finite sum of finite values (an overflow) is resolved by
    :func:`all_finite`."""
    return t.sum() if t.numel() else t.new_zeros(())


def all_finite(t: Tensor, flag: Optional[float] = None) -> bool:
    """Whether every entry of ``t`` is finite; ``flag``: :func:`finite_flag`'s value, if
    already synced. The exact pass runs only when the sum is not finite."""
    flag = float(finite_flag(t)) if flag is None else flag
    return math.isfinite(flag) or bool(torch.isfinite(t).all())


def check_graph_values(edge_index: Tensor, edge_weight: Optional[Tensor],
                       edge_head: Optional[Tensor], num_nodes: int, num_heads: int,
                       ids: bool = True, weights: bool = True) -> None:
    """The values of a user-given graph (:class:`~glomo_pyg.GlomoConv`'s edges, whose
    shapes and dtypes were checked): with ``ids``, node ids in ``[0, num_nodes)`` and
    heads in ``[0, num_heads)``; with ``weights``, finite weights. One device sync for
    all of them; ``ValueError`` otherwise."""
    weights = weights and edge_weight is not None
    ids = ids and edge_index.size(1) > 0
    stats = [finite_flag(edge_weight)] if weights else []
    if ids:
        stats += [edge_index.min(), edge_index.max()]
        if edge_head is not None:
            stats += [edge_head.min(), edge_head.max()]
    if not stats:
        return
    values = torch.stack([v.double() for v in stats]).tolist()  # the one device sync
    if weights and not all_finite(edge_weight, values.pop(0)):
        raise ValueError("edge_weight contains NaN or Inf")
    if ids:
        low, high = int(values[0]), int(values[1])
        if low < 0 or high >= num_nodes:
            raise ValueError(f"edge_index refers to nodes outside [0, {num_nodes}) "
                             f"(ids from {low} to {high})")
        if edge_head is not None and (values[2] < 0 or values[3] >= num_heads):
            raise ValueError(f"edge_head values must lie in [0, {num_heads}), got values "
                             f"from {int(values[2])} to {int(values[3])}")


# Under torch.compile, check_graph_values runs inside this opaque operator: compiled code
# calls it at run time with the real tensors, so a hostile graph raises the eager
# ValueError before any product reads it. It returns a copy of edge_index (an operator
# may not return its input) that the product then uses, so the check cannot be dropped
# as dead code and always runs first.
@torch.library.custom_op("glomo_pyg::checked_edge_index", mutates_args=())
def checked_edge_index(x: Tensor, edge_index: Tensor, edge_weight: Optional[Tensor],
                       edge_head: Optional[Tensor], num_heads: int) -> Tensor:
    """``edge_index`` (a copy) after :func:`check_graph_values`; for compiled callers."""
    check_graph_values(edge_index, edge_weight, edge_head, x.size(0), num_heads)
    return edge_index.clone()


@checked_edge_index.register_fake
def _(x, edge_index, edge_weight, edge_head, num_heads):
    return torch.empty_like(edge_index)


def head_blocked_index(edge_index: Tensor, edge_head: Tensor, num_nodes: int,
                       shared_input: bool = False, num_heads: Optional[int] = None,
                       assume_sorted: bool = False
                       ) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """:func:`head_blocked_edges` without the weights: ``(rows, cols, perm)`` with
    ``perm`` the permutation that sorts the edges (``None`` when they already are), so
    that the index of a graph used again with other weights is built once."""
    src, tgt = edge_index[0], edge_index[1]
    if num_heads is None:
        num_heads = int(edge_head.max()) + 1 if edge_head.numel() else 1
    small = num_heads * num_nodes < 2**31 - 1
    index = torch.int32 if small else edge_index.dtype
    # in place on fresh copies (copy=True: .to() returns edge_head itself when it already
    # has the index dtype, and the graph's heads must not change): no int64 temporaries
    # beside the two int32 results
    rows = edge_head.to(index, copy=True).mul_(num_nodes).add_(tgt.to(index))
    cols = src.to(index) if shared_input else \
        edge_head.to(index, copy=True).mul_(num_nodes).add_(src.to(index))
    if assume_sorted or rows.numel() <= 1:
        return rows, cols, None
    if is_compiling() or bool((rows[1:] < rows[:-1]).any()):
        width = num_nodes if shared_input else num_heads * num_nodes
        perm = torch.argsort(rows.long() * width + cols.long())
        return rows[perm], cols[perm], perm
    return rows, cols, None


def interleaved_index(edge_index: Tensor, edge_head: Tensor, num_nodes: int, num_heads: int
                      ) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """``(rows, cols, perm)`` of the ``[N H, N H]`` matrix that holds one aggregation
    matrix per head with node ``(v, h)`` at id ``v * H + h``: the rows of ``x`` ``[N, H C]``
    viewed as ``[N H, C]``, with no copy in or out (the head-blocked layout of
    :func:`head_blocked_index` copies ``x`` to ``[H N, C]`` and the result back). Each
    row's sources keep their order, so the sums are the same. ``perm`` sorts the edges by
    row (``None`` when they already are); the rows are sorted."""
    small = num_heads * num_nodes < 2**31 - 1
    index = torch.int32 if small else edge_index.dtype
    rows = edge_index[1].to(index, copy=True).mul_(num_heads).add_(edge_head.to(index))
    cols = edge_index[0].to(index, copy=True).mul_(num_heads).add_(edge_head.to(index))
    if rows.numel() <= 1:
        return rows, cols, None
    if is_compiling() or bool((rows[1:] < rows[:-1]).any()):
        perm = torch.argsort(rows.long() * (num_heads * num_nodes) + cols.long())
        return rows[perm], cols[perm], perm
    return rows, cols, None


def head_blocked_edges(edge_index: Tensor, edge_weight: Tensor, edge_head: Tensor,
                       num_nodes: int, shared_input: bool = False,
                       num_heads: Optional[int] = None,
                       assume_sorted: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """Rows, columns and weights of the block-diagonal ``[H*N, H*N]`` matrix that
    holds one ``[N, N]`` aggregation matrix ``A = G^T`` per head: node ``(h, v)``
    has id ``h * N + v``. With ``shared_input`` the columns stay ``0..N-1``
    (every head reads the same ``[N, C]`` input). Rows come out sorted: edges out
    of (head, target) order are sorted once, unless ``assume_sorted`` (emitted
    graphs are sorted). While compiling, the order cannot be inspected, so the
    edges are always sorted (a no-op permutation for sorted input).

    Indices are int32 whenever ``H * N`` fits (half the memory of int64 and a
    faster sort in the backward; CSR kernels take either), int64 otherwise."""
    rows, cols, perm = head_blocked_index(edge_index, edge_head, num_nodes, shared_input,
                                          num_heads, assume_sorted)
    return rows, cols, edge_weight if perm is None else edge_weight[perm]


def check_head_edges(x: Tensor, edge_index: Tensor, edge_weight: Tensor, edge_head: Tensor,
                     num_heads: int) -> None:
    """Shapes, dtypes and ranges of features and per-head edge lists (``ValueError``
    otherwise)."""
    tensors = (x, edge_index, edge_weight, edge_head)
    if not all(isinstance(t, Tensor) for t in tensors) or x.dim() not in (2, 3) or \
            (x.dim() == 3 and x.size(0) != num_heads) or edge_index.dtype != torch.long or \
            edge_index.dim() != 2 or edge_index.size(0) != 2 or \
            not edge_weight.dtype.is_floating_point or edge_head.dtype != torch.long or \
            not edge_weight.shape == edge_head.shape == (edge_index.size(1),):
        raise ValueError(f"x must be [N, C] or [H, N, C] with H = {num_heads}, edge_index an "
                         f"int64 [2, E] tensor, edge_weight a floating-point [E] and edge_head "
                         f"an int64 [E] tensor; got "
                         + ", ".join(f"{t.dtype} {tuple(t.shape)}" if isinstance(t, Tensor)
                                     else type(t).__name__ for t in tensors))
    check_graph_values(edge_index, edge_weight, edge_head, x.size(-2), num_heads,
                       weights=False)


def head_propagate(x: Tensor, edge_index: Tensor, edge_weight: Tensor, edge_head: Tensor,
                   num_heads: int) -> Tensor:
    r"""Per-head propagation :math:`P^{(h)}_j = \sum_i G^{(h)}_{ij} x^{(h)}_i`.

    ``x`` is ``[N, C]`` (every head propagates the same features: ``G^{(h)}``
    applied to all of ``x``) or head-blocked ``[H, N, C]`` (head ``h``
    propagates its own ``x[h]``, as in a chain :math:`G^1 G^2 \cdots`).
    Returns ``[H, N, C]``. One CSR spmm over the head-blocked graph (see
    :func:`weighted_spmm`); gradients reach ``x`` and ``edge_weight``. Edges in
    any order; ids and heads out of range raise ``ValueError``.
    """
    check_head_edges(x, edge_index, edge_weight, edge_head, num_heads)
    return propagate_unchecked(x, edge_index, edge_weight, edge_head, num_heads)


def propagate_unchecked(x: Tensor, edge_index: Tensor, edge_weight: Tensor, edge_head: Tensor,
                        num_heads: int, assume_sorted: bool = False) -> Tensor:
    """:func:`head_propagate` over validated edges."""
    rows, cols, weight = head_blocked_edges(edge_index, edge_weight, edge_head, x.shape[-2],
                                            x.dim() == 2, num_heads, assume_sorted)
    return blocked_propagate(x, rows, cols, weight, num_heads)


def blocked_propagate(x: Tensor, rows: Tensor, cols: Tensor, weight: Tensor,
                      num_heads: int) -> Tensor:
    """``[H, N, C]`` propagation over head-blocked rows/columns from
    :func:`head_blocked_edges` (``x`` ``[N, C]`` shared by the heads when the columns
    were built with ``shared_input``, else ``[H, N, C]``)."""
    n, c = x.shape[-2], x.shape[-1]
    flat = x if x.dim() == 2 else x.reshape(num_heads * n, c)
    return spmm_unchecked(rows, cols, weight, flat, num_heads * n).view(num_heads, n, c)
