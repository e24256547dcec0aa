"""Kernels behind the GLoMo layers (no modules, no state).

* :func:`latent_graph_edges`: per-head keys and queries to the pruned, column-normalised
  graphs of paper Eq. 1 as target-sorted edge lists, block by block (forward and
  backward), so memory is O(E + block_size).
* :func:`weighted_spmm`: a row-sorted sparse matrix times dense features as one CSR
  spmm, with gradients to the weights and the features, never forming ``[E, C]``.

``G[i, j]`` is the weight of the edge from source ``i`` to target ``j``; each target's
incoming weights sum to 1 or it has no incoming edge.
"""
from __future__ import annotations

import math
import warnings
from typing import List, Optional, Sequence, Tuple, cast

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from glomo_pyg.ordering import DIRECTIONS, SequenceOrder
from glomo_pyg.sequences import first_failure

NORMALIZATIONS = ("relu2", "softmax")


# The most (head, source, target) pairs one graph layer of one call may hold: sparse, an
# upper bound on the edges (28 bytes each; 2**27 edges are 3.5 GiB); dense, the B H T^2
# weights of a block. Checked from host sizes before allocating (docs/design.md, "Limits").
MAX_GRAPH_PAIRS = 1 << 27


def graph_pairs(layout: str, num_sequences: int, num_nodes: int, max_len: int, heads: int,
                include_self: bool = False) -> int:
    """Upper bound on what one graph layer holds: ``'dense'``, ``B H T^2`` weights; else
    ``H N (T - 1) / 2`` pairs (``T + 1`` with ``include_self``). Host integers: no sync."""
    if layout == "dense":
        return num_sequences * heads * max_len * max_len
    return heads * num_nodes * max(0, max_len - 1 + 2 * int(include_self)) // 2


def check_graph_size(layout: str, num_sequences: int, num_nodes: int, max_len: int,
                     heads: int, include_self: bool = False, hint: str = "") -> None:
    """``ValueError`` when one graph layer could exceed :data:`MAX_GRAPH_PAIRS`."""
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


def _allowed(j0: int, j1: int, i0: int, i1: int, lengths: Tensor, direction: str,
             include_self: bool) -> Tensor:
    """``[Bg, tj, ti]`` allowed (target, source) pairs of a block."""
    return SequenceOrder(direction, include_self).block_mask(j0, j1, i0, i1, lengths)


# Keys and queries whose largest entry exceeds 2**SAFE_EXPONENT are rescaled by exact powers
# of two, so scores stay finite in fp32 (docs/design.md, "Emission").
SAFE_EXPONENT = 50


def _safe_scale(x: Tensor, dims: Tuple[int, ...]) -> Tensor:
    """Power-of-two factors <= 1 bringing ``max |x|`` over ``dims`` below the bound."""
    m = x.detach().abs().amax(dim=dims, keepdim=True)
    _, exponent = torch.frexp(m)  # m = f * 2**exponent with f in [0.5, 1)
    return torch.ldexp(torch.ones_like(m), (SAFE_EXPONENT - exponent).clamp(max=0))


def _safe_scales(key: Tensor, query: Tensor) -> Tuple[Tensor, Tensor]:
    """Factors ``[B, H, 1, 1]`` (one per target's sources) and ``[B, H, T, 1]``."""
    return _safe_scale(key, (2, 3)), _safe_scale(query, (3,))


def _within_bound(x: Tensor) -> bool:
    """Every entry of ``x`` below ``2**SAFE_EXPONENT`` in magnitude (no factor to apply)."""
    if x.numel() == 0:
        return True
    low, high = torch.aminmax(x)  # (one pass)
    return bool(torch.maximum(high, -low) < 2.0 ** SAFE_EXPONENT)


def bounded_keys_queries(key: Tensor, query: Tensor) -> Tuple[Tensor, Tensor]:
    """Keys and queries rescaled exactly (:data:`SAFE_EXPONENT`) so no score overflows.
    Squared-ReLU graphs are unchanged; softmax graphs are not: ``'relu2'`` only."""
    if key.device.type == "cpu" and not is_compiling() and _within_bound(key) and \
            _within_bound(query):  # (the usual case, told by one host sync: free on a CPU)
        return key, query
    ck, cq = _safe_scales(key, query)
    return key * ck.to(key.dtype), query * cq.to(query.dtype)


def normalise_scores(scores: Tensor, allowed: Tensor, normalization: str,
                     unscale: Optional[Tuple[Tensor, Tensor]] = None):
    """Column-normalised weights of a block (last dim = sources), and what backward needs."""
    # relative to each target's largest score (the ratio cancels): no overflow, no 0/0
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
    return (0, j1) if direction == "forward" else (j0, max_len)


# Cap of blocks that batch several heads: bigger ones lose to cache misses
# (benchmarks/results/speed.md, "emission blocks").
HEAD_BATCH_SCORES = 1 << 19


def _head_plan(num_seqs: int, heads: int, max_len: int, block_size: int):
    """Head ranges and (sequences, targets) per block of at most ``block_size`` scores."""
    per_seq = heads * max_len * max_len  # all heads of one sequence
    target = min(block_size, HEAD_BATCH_SCORES)
    if heads > 1 and 2 * per_seq <= target:
        group = max(1, min(num_seqs, target // per_seq))
        return [(0, heads)], group, max_len
    if max_len * max_len <= block_size:  # else tile one sequence: emission stays sorted
        group, tile = max(1, min(num_seqs, block_size // (max_len * max_len))), max_len
    else:
        group, tile = 1, max(1, block_size // max_len)
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
    """Keys and queries in ``dtype``, rescaled, and the inverse ``(query, key)`` factors."""
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
                g, _ = normalise_scores(scores, allowed.unsqueeze(1), normalization,
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
                g, aux = normalise_scores(qb @ kb.transpose(-1, -2), allowed.unsqueeze(1),
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
                    safe = torch.where(scale > 0, scale, torch.ones((), device=scale.device))
                    grad_s = 2.0 * u / safe * centred
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
    """The public emission functions' arguments; ``finite``: finite keys, queries (sync)."""
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

    With :math:`s_{ij} = k_i^\top q_j` and the allowed sources :math:`\mathcal{A}(j)` of
    target :math:`j` (``i < j`` forward, ``i > j`` backward, ``=`` with ``include_self``):

    .. math::
        G_{ij} = \frac{\mathrm{ReLU}(s_{ij})^2}
                 {\sum_{i' \in \mathcal{A}(j)} \mathrm{ReLU}(s_{i'j})^2}

    or a softmax over :math:`\mathcal{A}(j)` for ``normalization='softmax'``.
    Only strictly positive weights become edges. Computed in fp32 (fp64 for fp64 inputs),
    overflow-safe (:data:`SAFE_EXPONENT`). NaN or Inf keys or queries raise
    ``ValueError`` unless ``check=False``.

    Args:
        key, query: ``[B, H, T, D]`` padded per-head keys and queries.
        lengths: ``[B]`` valid length of each sequence.
        ptr: ``[B + 1]`` flat offset of each sequence.
        block_size: at most this many dense scores are held per block.
        sizes: ``lengths`` as host integers (:attr:`SequenceBatch.sizes`); read from
            ``lengths`` (a device sync) when not given.

    Returns:
        ``(edge_index [2, E], edge_weight [E], edge_head [E])`` sorted by ``(head, target,
        source)``; gradients flow from ``edge_weight`` to ``key`` and ``query``.
    """
    _check_emission_args(key, query, direction, normalization, block_size, finite=check)
    sizes = lengths.tolist() if sizes is None else list(sizes)
    return _LatentGraphEdges.apply(key, query, lengths, ptr, sizes, direction, include_self,
                                   normalization, block_size)


def latent_graph_dense(key: Tensor, query: Tensor, lengths: Tensor, *,
                       direction: str = "forward", include_self: bool = False,
                       normalization: str = "relu2", check: bool = True) -> Tensor:
    r"""The graphs of :func:`latent_graph_edges` as dense ``[B, H, T, T]`` blocks,
    ``[b, h, i, j] = G_ij`` (zero at padding, disallowed and pruned pairs); same arithmetic,
    plain autograd (``O(B H T^2)`` memory). NaN or Inf keys or queries raise
    ``ValueError`` unless ``check=False``."""
    _check_emission_args(key, query, direction, normalization, finite=check)
    dtype = torch.promote_types(key.dtype, torch.float32)
    t = key.size(2)
    with torch.autocast(key.device.type, enabled=False):
        k, q, unscale = _scaled(key, query, dtype)  # constant factors: autograd passes them
        scores = q @ k.transpose(-1, -2)  # [B, H, T(j), T(i)]
        allowed = _allowed(0, t, 0, t, lengths, direction, include_self).unsqueeze(1)
        g, _ = normalise_scores(scores, allowed, normalization, unscale)
    return g.transpose(-1, -2)


# False keeps the keep-alive scan and fused propagation in float32 under bfloat16 autocast.
FOLLOW_AUTOCAST = True


def autocast_half_dtype(device_type: str) -> Optional[torch.dtype]:
    """``torch.bfloat16`` in an enabled bfloat16 autocast region (and
    :data:`FOLLOW_AUTOCAST`), else ``None``; never float16, whose range scores exceed."""
    if FOLLOW_AUTOCAST and torch.is_autocast_enabled(device_type) and \
            torch.get_autocast_dtype(device_type) == torch.bfloat16:
        return torch.bfloat16
    return None


def _column_max_scan(k: Tensor, q: Tensor, lengths: Tensor, direction: str,
                     include_self: bool, tile: int) -> Tuple[Tensor, Tensor]:
    """``(best, arg)`` ``[B, H, T]``: each target's largest allowed score and source."""
    t = k.size(2)
    best, arg = [], []
    for j0 in range(0, t, tile):
        j1 = min(t, j0 + tile)
        i0, i1 = _block_ranges(direction, j0, j1, t)
        scores = q[:, :, j0:j1] @ k[:, :, i0:i1].transpose(-1, -2)  # [B, H, tj, ti]
        allowed = _allowed(j0, j1, i0, i1, lengths, direction, include_self)
        top = scores.masked_fill_(~allowed.unsqueeze(1), float("-inf")).max(-1)
        best.append(top.values)
        arg.append(top.indices + i0)
    return torch.cat(best, -1), torch.cat(arg, -1)


def column_max_scores(key: Tensor, query: Tensor, lengths: Tensor, *,
                      direction: str = "forward", include_self: bool = False,
                      block_size: int = 1 << 22,
                      scan_dtype: Optional[torch.dtype] = None) -> Tensor:
    r"""Each target's largest allowed score :math:`\max_{i \text{ allowed}} s_{ij}`,
    :math:`s_{ij} = k_i^\top q_j` (``-inf`` without allowed sources and at padding): a
    squared-ReLU column has an edge iff it is positive.

    Scanned without autograd; only the arg-max scores are recomputed with autograd
    (backward O(B H T D)). ``scan_dtype`` ``None`` follows autocast; a bfloat16 scan
    only picks the arg-max, whose float32 score is low only at near-ties, by about
    :math:`3 \cdot 2^{-8} \max_i \sum_d |k_{id} q_{jd}|`.

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
    # block_size per head: smaller tiles launched many tiny matmuls (10-20% of a pixel
    # step's GPU time, benchmarks/results/speed.md); a narrower dtype takes more scores.
    tile = max(1, block_size // max(1, b * t)) * max(1, dtype.itemsize // scan.itemsize)
    with torch.autocast(key.device.type, enabled=False):
        k, q = key.to(dtype), query.to(dtype)
        # without autograd: differentiating through amax kept every tile (O(B H T^2))
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
    r""":func:`head_propagate` over dense blocks ``adj`` ``[B, H, T, T]``
    (``[b, h, i, j] = G_ij``): ``x`` ``[N, C]`` or ``[H, N, C]`` to ``[H, N, C]``."""
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
    """CSR without invariant checks (a pass each) nor torch's one-time "beta" notice."""
    global _CSR_NOTICE_SEEN
    if _CSR_NOTICE_SEEN:
        return torch.sparse_csr_tensor(row_ptr, col, value, size, check_invariants=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly")
        out = torch.sparse_csr_tensor(row_ptr, col, value, size, check_invariants=False)
    _CSR_NOTICE_SEEN = True
    return out


def row_pointers(row: Tensor, num_rows: int) -> Tensor:
    """CSR row pointers of sorted rows, in the rows' index dtype (as CSR needs)."""
    return torch._convert_indices_from_coo_to_csr(row, num_rows,
                                                  out_int32=row.dtype == torch.int32)


# A custom operator: torch.compile cannot trace sparse-tensor construction.
@torch.library.custom_op("glomo_pyg::weighted_spmm", mutates_args=())
def _spmm_op(row: Tensor, col: Tensor, weight: Tensor, x: Tensor, num_rows: int,
             row_ptr: Optional[Tensor] = None) -> Tensor:
    row_ptr = row_pointers(row, num_rows) if row_ptr is None else row_ptr
    with torch.autocast(x.device.type, enabled=False):  # the dtype of x, as given
        return _csr(row_ptr, col, weight.to(x.dtype), (num_rows, x.size(0))) @ x


@_spmm_op.register_fake
def _(row, col, weight, x, num_rows, row_ptr=None):
    return x.new_empty(num_rows, x.size(1))


@torch.library.custom_op("glomo_pyg::weighted_spmm_backward", mutates_args=())
def _spmm_backward_op(grad_out: Tensor, row: Tensor, col: Tensor, weight: Tensor, x: Tensor,
                      num_rows: int, need_weight: bool, need_x: bool) -> Tuple[Tensor, Tensor]:
    with torch.autocast(x.device.type, enabled=False):  # backward may run inside autocast
        return _spmm_backward_impl(grad_out, row, col, weight, x, num_rows, need_weight, need_x)


# The backward needs about 60 bytes of scratch per edge of a row chunk: E is cut into up to
# BACKWARD_MAX_CHUNKS chunks of at least BACKWARD_MIN_CHUNK edges (peak memory E/16 * 60).
BACKWARD_MIN_CHUNK, BACKWARD_MAX_CHUNKS = 1 << 16, 16


def _row_chunks(row_ptr: Tensor, num_edges: int) -> List[Tuple[int, int, int, int]]:
    """``(r0, r1, e0, e1)``: whole-row ranges of about equal edge counts."""
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
    row_ptr = row_pointers(row, num_rows)
    for r0, r1, e0, e1 in _row_chunks(row_ptr, row.numel()):
        r, c, w = row[e0:e1] - r0, col[e0:e1], weight[e0:e1]
        c0, c1 = int(c.min()), int(c.max()) + 1  # the columns this chunk touches
        c = c - c0
        g_out, x_part = grad_out[r0:r1], x[c0:c1]
        if need_x:
            # A^T @ grad_out; spmm wants CSR: transpose by a stable sort of the columns
            sorted_c, perm = torch.sort(c, stable=True)
            transposed = _csr(row_pointers(sorted_c, c1 - c0), r[perm], w[perm].to(x.dtype),
                              (c1 - c0, r1 - r0))
            del sorted_c, perm
            grad_x[c0:c1] += transposed @ g_out
            del transposed
        if need_weight:
            # d out[r] / d w_e = grad_out[r] . x[col_e]: a sampled dense-dense product
            pattern = _csr(row_pointers(r, r1 - r0), c, torch.zeros_like(w, dtype=x.dtype),
                           (r1 - r0, c1 - c0))
            grad_weight[e0:e1] = torch.sparse.sampled_addmm(
                pattern, g_out, x_part.t().contiguous(), beta=0.0).values().to(weight.dtype)
    return grad_weight, grad_x


@_spmm_backward_op.register_fake
def _(grad_out, row, col, weight, x, num_rows, need_weight, need_x):
    return torch.empty_like(weight), torch.empty_like(x)


def _spmm_setup_context(ctx, inputs, output):
    row, col, weight, x, num_rows, _ = inputs
    ctx.save_for_backward(row, col, weight, x)
    ctx.num_rows = num_rows


def _spmm_backward(ctx, grad_out):
    row, col, weight, x = ctx.saved_tensors
    need_weight, need_x = ctx.needs_input_grad[2], ctx.needs_input_grad[3]
    grad_weight, grad_x = _spmm_backward_op(grad_out, row, col, weight, x, ctx.num_rows,
                                            need_weight, need_x)
    return (None, None, grad_weight if need_weight else None, grad_x if need_x else None, None,
            None)


_spmm_op.register_autograd(_spmm_backward, setup_context=_spmm_setup_context)


def spmm_unchecked(row: Tensor, col: Tensor, weight: Tensor, x: Tensor, num_rows: int,
                   row_ptr: Optional[Tensor] = None) -> Tensor:
    """:func:`weighted_spmm` without the index checks, for validated indices (``row_ptr``:
    the rows' CSR pointers when already known)."""
    out_dtype = x.dtype
    if x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    if row.numel() == 0:
        return x.new_zeros(num_rows, x.size(1), dtype=out_dtype)
    # autocast would recast the operands (to bf16 on CPU, which has no sparse kernel for it)
    with torch.autocast(x.device.type, enabled=False):
        return _spmm_op(row, col, weight, x, num_rows, row_ptr).to(out_dtype)


def weighted_spmm(row: Tensor, col: Tensor, weight: Tensor, x: Tensor, num_rows: int) -> Tensor:
    r"""``out[r] = sum_e [row_e = r] * weight_e * x[col_e]`` as one CSR spmm.

    ``row`` must be sorted ascending. Gradients flow to ``weight`` and ``x``; memory is
    O(E + rows * C). Half precision on CPU is computed in fp32. Indices out of range,
    unsorted rows or mismatched shapes raise ``ValueError``.
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
    """True while ``torch.compile`` traces the caller (checks that sync are skipped)."""
    return torch.compiler.is_compiling()


def check_graph_values(edge_index: Tensor, edge_weight: Optional[Tensor],
                       edge_head: Optional[Tensor], num_nodes: int, num_heads: int,
                       ids: bool = True, weights: bool = True) -> None:
    """The values of a user-given graph whose shapes and dtypes were checked: with ``ids``,
    node ids in ``[0, num_nodes)`` and heads in ``[0, num_heads)``; with ``weights``, finite
    weights. One device sync; ``ValueError`` naming everything wrong."""
    weights = weights and edge_weight is not None
    ids = ids and edge_index.size(1) > 0
    # a finite sum proves no NaN or Inf in one pass; only a non-finite one needs the exact pass
    stats = [cast(Tensor, edge_weight).sum()] if weights else []  # (weights: not None)
    if ids:
        stats += [edge_index.min(), edge_index.max()]
        if edge_head is not None:
            stats += [edge_head.min(), edge_head.max()]
    if not stats:
        return
    values = torch.stack([v.double() for v in stats]).tolist()  # the one device sync
    problems = []
    if weights and not (math.isfinite(values.pop(0)) or
                        bool(torch.isfinite(cast(Tensor, edge_weight)).all())):
        problems.append("edge_weight contains NaN or Inf")
    if ids:
        low, high = int(values[0]), int(values[1])
        if low < 0 or high >= num_nodes:
            problems.append(f"edge_index refers to nodes outside [0, {num_nodes}) "
                            f"(ids from {low} to {high})")
        if edge_head is not None and (values[2] < 0 or values[3] >= num_heads):
            problems.append(f"edge_head values must lie in [0, {num_heads}), got values "
                            f"from {int(values[2])} to {int(values[3])}")
    if problems:
        raise ValueError("; ".join(problems))


# Under torch.compile, check_graph_values runs inside this opaque operator at run time with
# the real tensors. It returns a copy of edge_index (an operator may not return its input)
# that the product then uses, so the check cannot be dropped as dead code.
@torch.library.custom_op("glomo_pyg::checked_edge_index", mutates_args=())
def checked_edge_index(x: Tensor, edge_index: Tensor, edge_weight: Optional[Tensor],
                       edge_head: Optional[Tensor], num_heads: int) -> Tensor:
    """``edge_index`` (a copy) after :func:`check_graph_values`; for compiled callers."""
    check_graph_values(edge_index, edge_weight, edge_head, x.size(0), num_heads)
    return edge_index.clone()


@checked_edge_index.register_fake
def _(x, edge_index, edge_weight, edge_head, num_heads):
    return torch.empty_like(edge_index)


def check_dense_graph_values(adj: Tensor) -> None:
    """Dense graph blocks given by a user hold finite weights (the rule
    :func:`check_graph_values` applies to edge weights); one device sync."""
    # a finite sum proves it in one pass; only a non-finite one needs the exact pass
    if not (math.isfinite(float(adj.detach().sum())) or bool(torch.isfinite(adj).all())):
        raise ValueError("adj contains NaN or Inf")


def _index_dtype(size: int, dtype: torch.dtype) -> torch.dtype:
    """int32 where ids below ``size`` fit (half the memory, a faster sort), else ``dtype``."""
    return torch.int32 if size < 2**31 - 1 else dtype


def _sort_rows(rows: Tensor, cols: Tensor, width: int
               ) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """``(rows, cols, perm)`` sorted by (row, column), always while compiling."""
    if rows.numel() > 1 and (is_compiling() or bool((rows[1:] < rows[:-1]).any())):
        perm = torch.argsort(rows.long() * width + cols.long())
        return rows[perm], cols[perm], perm
    return rows, cols, None


def head_blocked_index(edge_index: Tensor, edge_head: Tensor, num_nodes: int,
                       shared_input: bool = False, num_heads: Optional[int] = None,
                       assume_sorted: bool = False
                       ) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """:func:`head_blocked_edges` without the weights: ``(rows, cols, perm)`` with
    ``perm`` the permutation that sorts the edges (``None`` when they already are)."""
    src, tgt = edge_index[0], edge_index[1]
    if num_heads is None:
        num_heads = int(edge_head.max()) + 1 if edge_head.numel() else 1
    index = _index_dtype(num_heads * num_nodes, edge_index.dtype)
    # copy=True: .to() may return edge_head itself, which must not change in place
    rows = edge_head.to(index, copy=True).mul_(num_nodes).add_(tgt.to(index))
    cols = src.to(index) if shared_input else \
        edge_head.to(index, copy=True).mul_(num_nodes).add_(src.to(index))
    if assume_sorted:
        return rows, cols, None
    return _sort_rows(rows, cols, num_nodes if shared_input else num_heads * num_nodes)


def interleaved_index(edge_index: Tensor, edge_head: Tensor, num_nodes: int, num_heads: int
                      ) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """``(rows, cols, perm)`` of the ``[N H, N H]`` matrix with node ``(v, h)`` at id
    ``v * H + h`` (``x`` ``[N, H C]`` viewed as ``[N H, C]``: no copy in or out)."""
    index = _index_dtype(num_heads * num_nodes, edge_index.dtype)
    rows = edge_index[1].to(index, copy=True).mul_(num_heads).add_(edge_head.to(index))
    cols = edge_index[0].to(index, copy=True).mul_(num_heads).add_(edge_head.to(index))
    return _sort_rows(rows, cols, num_heads * num_nodes)


def head_blocked_edges(edge_index: Tensor, edge_weight: Tensor, edge_head: Tensor,
                       num_nodes: int, shared_input: bool = False,
                       num_heads: Optional[int] = None,
                       assume_sorted: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """Rows, columns and weights of the block-diagonal ``[H N, H N]`` matrix of one
    ``A = G^T`` per head, node ``(h, v)`` at id ``h N + v`` (columns ``0..N-1`` with
    ``shared_input``), rows sorted unless ``assume_sorted``."""
    rows, cols, perm = head_blocked_index(edge_index, edge_head, num_nodes, shared_input,
                                          num_heads, assume_sorted)
    return rows, cols, edge_weight if perm is None else edge_weight[perm]


def head_propagate(x: Tensor, edge_index: Tensor, edge_weight: Tensor, edge_head: Tensor,
                   num_heads: int) -> Tensor:
    r"""Per-head propagation :math:`P^{(h)}_j = \sum_i G^{(h)}_{ij} x^{(h)}_i`.

    ``x`` is ``[N, C]`` (shared by the heads) or ``[H, N, C]`` (head ``h`` propagates
    ``x[h]``); returns ``[H, N, C]``. Edges in any order; ids and heads out of range
    raise ``ValueError``.
    """
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
    rows, cols, weight = head_blocked_edges(edge_index, edge_weight, edge_head, x.shape[-2],
                                            x.dim() == 2, num_heads)
    return blocked_propagate(x, rows, cols, weight, num_heads)


def blocked_propagate(x: Tensor, rows: Tensor, cols: Tensor, weight: Tensor,
                      num_heads: int, row_ptr: Optional[Tensor] = None) -> Tensor:
    """``[H, N, C]`` propagation over rows/columns from :func:`head_blocked_edges`
    (``x`` ``[N, C]`` if built with ``shared_input``, else ``[H, N, C]``)."""
    n, c = x.shape[-2], x.shape[-1]
    flat = x if x.dim() == 2 else x.reshape(num_heads * n, c)
    return spmm_unchecked(rows, cols, weight, flat, num_heads * n, row_ptr).view(num_heads, n, c)
