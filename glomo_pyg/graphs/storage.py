"""How one graph layer is stored (:class:`EdgeStorage`, :class:`DenseStorage`,
:class:`FusedStorage`, :class:`UniformStorage`), and what every layer of a batch shares
(:class:`GraphFrame`); docs/design.md, "Graph layouts and storages"."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Dict, Hashable, Optional, Tuple, cast

import torch
from torch import Tensor

from glomo_pyg import flex
from glomo_pyg.graphs.score_blocks import propagate_scores
from glomo_pyg.kernels import (
    autocast_half_dtype,
    blocked_propagate,
    check_graph_size,
    dense_head_propagate,
    head_blocked_edges,
    is_compiling,
    latent_graph_dense,
    latent_graph_edges,
    row_pointers,
)
from glomo_pyg.ordering import RasterOrder, SequenceOrder, UnitOrder
from glomo_pyg.sequences import SequenceBatch

LayerEdges = Tuple[Tensor, Tensor, Tensor]


class GraphFrame:
    """What every layer of one :class:`~glomo_pyg.graphs.LatentGraphs` shares: sequences,
    heads, direction, ``include_self``, the allowed-sources rule (``None``:
    :class:`~glomo_pyg.ordering.SequenceOrder`) and a cache of what the storages derive."""

    __slots__ = ("sequences", "num_heads", "direction", "include_self", "explicit_order",
                 "cache")

    def __init__(self, sequences: SequenceBatch, num_heads: int, direction: str,
                 include_self: bool = False, order: Optional[UnitOrder] = None):
        self.sequences = sequences
        self.num_heads = int(num_heads)
        self.direction = direction
        self.include_self = bool(include_self)
        self.explicit_order = order
        self.cache: Dict[Hashable, object] = {}

    @property
    def order(self) -> UnitOrder:
        if self.explicit_order is not None:
            return self.explicit_order
        return SequenceOrder(self.direction, self.include_self)

    @property
    def num_nodes(self) -> int:
        return self.sequences.num_nodes

    def replace(self, sequences: Optional[SequenceBatch] = None,
                order: Optional[UnitOrder] = None) -> "GraphFrame":
        """A new frame (empty cache) with other sequences or another order."""
        return GraphFrame(self.sequences if sequences is None else sequences, self.num_heads,
                          self.direction, self.include_self,
                          self.explicit_order if order is None else order)

    def cached(self, key: Hashable, build: Callable[[], object]):
        if key not in self.cache:
            self.cache[key] = build()
        return self.cache[key]

    def check_size(self, layout: str, hint: str = "") -> None:
        """Refuse what one layer in ``layout`` could not hold (no sync)."""
        s = self.sequences
        check_graph_size(layout, s.num_sequences, s.num_nodes, s.max_len, self.num_heads,
                         self.include_self, hint)

    def near(self, target: Tensor, source: Tensor, max_distance: int) -> Tensor:
        """Which (flat) target, source pairs lie within the window."""
        position = self.sequences.position
        return self.order.window_distance(position[target], position[source]) <= max_distance

    def cut_edges(self, edges: LayerEdges, max_distance: int) -> LayerEdges:
        """One layer's edges within the window, each target's total weight kept."""
        (src, tgt), w, h = edges
        n = self.num_nodes
        keep = self.near(tgt, src, max_distance)
        column = h.to(torch.int64) * n + tgt
        before = w.new_zeros(self.num_heads * n).index_add(0, column, w)
        src, tgt, w, h, column = src[keep], tgt[keep], w[keep], h[keep], column[keep]
        total = w.new_zeros(self.num_heads * n).index_add(0, column, w)
        # w / total <= 1 first: no overflow for tiny totals (a zero column stays zero)
        w = w / total.masked_fill(total == 0, 1)[column] * before[column]
        return torch.stack([src, tgt]), w, h

    def cut_block(self, block: Tensor, max_distance: int) -> Tensor:
        """One layer's ``[B, H, T, T]`` block within the window, totals kept."""
        pos = torch.arange(block.size(-1), device=block.device)
        near = self.order.window_distance(pos.view(1, -1), pos.view(-1, 1)) <= max_distance
        kept = block * near.to(block.dtype)  # [i, j]: source i, target j
        total = kept.sum(-2, keepdim=True)  # per target j: over its sources i
        # kept / total <= 1 first: a tiny total cannot overflow the rescaling
        return kept / total.masked_fill(total == 0, 1) * block.sum(-2, keepdim=True)

    def edges_to_block(self, edges: LayerEdges) -> Tensor:
        """``[B, H, T, T]`` block of one layer's edges (differentiable)."""
        (src, tgt), w, h = edges
        s = self.sequences
        seq = s.batch[tgt]
        dense = w.new_zeros(s.num_sequences, self.num_heads, s.max_len, s.max_len)
        return dense.index_put((seq, h, src - s.ptr[seq], tgt - s.ptr[seq]), w)

    def block_to_edges(self, block: Tensor) -> LayerEdges:
        # (h, b, j, i) order: sorted by (head, target, source), as emitted graphs
        h, b, j, i = (block.transpose(-1, -2).transpose(0, 1) != 0).nonzero(as_tuple=True)
        offset = self.sequences.ptr[b]
        return torch.stack([offset + i, offset + j]), block[b, h, i, j], h

    def propagate_edges(self, owner: "GraphStorage", edges: LayerEdges, x: Tensor,
                        sorted_edges: bool) -> Tensor:
        """One CSR product over all heads, index arrays and row pointers built once per
        storage and kind."""
        shared = x.dim() == 2

        def blocked():
            ei, ew, eh = edges
            rows, cols, weight = head_blocked_edges(ei, ew, eh, self.num_nodes, shared,
                                                    self.num_heads, sorted_edges)
            size = self.num_heads * self.num_nodes
            return rows, cols, weight, None if is_compiling() else row_pointers(rows, size)

        # (compiled: built in the graph; a key by id() would guard on this storage object
        # and recompile for every new batch's graphs)
        rows, cols, weight, row_ptr = blocked() if is_compiling() else \
            self.cached(("blocked", id(owner), shared), blocked)
        return blocked_propagate(x, rows, cols, weight.to(x.dtype), self.num_heads, row_ptr)


class GraphStorage(ABC):
    """One graph layer in one layout; immutable (changes return a new storage)."""

    layout: str = ""

    @abstractmethod
    def propagate(self, frame: GraphFrame, x: Tensor) -> Tensor:
        r""":math:`P^{(h)}_j = \sum_i G_{ij}\, x^{(h)}_i`, ``[H, N, C]`` from ``x`` of
        ``[N, C]`` or ``[H, N, C]`` (checked by the caller)."""

    @abstractmethod
    def edges(self, frame: GraphFrame) -> LayerEdges:
        """``(edge_index, edge_weight, edge_head)``, sorted by (head, target, source)
        unless the edges were given by hand."""

    def dense(self, frame: GraphFrame) -> Tensor:
        """``[B, H, T, T]`` block, ``[b, h, i, j] = G_ij``."""
        frame.check_size("dense")
        return frame.edges_to_block(self.edges(frame))

    def num_edges(self, frame: GraphFrame) -> int:
        return int(self.edges(frame)[0].size(1))

    def propagate_head_mean(self, frame: GraphFrame, x: Tensor) -> Tensor:
        r""":math:`\sum_i \bar G_{ij} x_i` along the head-averaged graph
        :math:`\bar G = \frac{1}{H} \sum_h G^{(h)}`: ``[1, N, C]`` from ``[N, C]`` or
        ``[1, N, C]``."""
        return self.propagate(frame, x[0] if x.dim() == 3 else x).mean(0, keepdim=True)

    @abstractmethod
    def within(self, frame: GraphFrame, max_distance: int) -> "GraphStorage":
        """The layer with edges longer than ``max_distance`` removed, each target's
        remaining weights rescaled to their former total."""

    @abstractmethod
    def apply(self, fn: Callable[[Tensor], Tensor]) -> "GraphStorage":
        """The storage with ``fn`` applied to each of its tensors."""

    def to(self, device) -> "GraphStorage":
        return self.apply(lambda t: t.to(device))


class EdgeStorage(GraphStorage):
    """Pruned edges: ``edge_index [2, E]`` (row 0 source, row 1 target, flat ids),
    ``edge_weight [E]``, ``edge_head [E]``; ``sorted_edges``: in (head, target, source)
    order (else sorted once, when first propagated)."""

    layout = "sparse"

    def __init__(self, edge_index: Tensor, edge_weight: Tensor, edge_head: Tensor,
                 sorted_edges: bool = True):
        self.edge_index, self.edge_weight, self.edge_head = edge_index, edge_weight, edge_head
        self.sorted_edges = bool(sorted_edges)

    def edges(self, frame: GraphFrame) -> LayerEdges:
        return self.edge_index, self.edge_weight, self.edge_head

    def propagate(self, frame: GraphFrame, x: Tensor) -> Tensor:
        return frame.propagate_edges(self, self.edges(frame), x, self.sorted_edges)

    def within(self, frame: GraphFrame, max_distance: int) -> "EdgeStorage":
        # filtering keeps the (head, target, source) order
        return EdgeStorage(*frame.cut_edges(self.edges(frame), max_distance),
                           sorted_edges=self.sorted_edges)

    def apply(self, fn) -> "EdgeStorage":
        return EdgeStorage(fn(self.edge_index), fn(self.edge_weight), fn(self.edge_head),
                           sorted_edges=self.sorted_edges)

    def __repr__(self) -> str:
        return f"EdgeStorage(edges={self.edge_index.size(1)})"


class DenseStorage(GraphStorage):
    """One padded ``[B, H, T, T]`` block, zero at padding and absent edges (batched matmuls
    beat the sparse product over short sequences and dense graphs)."""

    layout = "dense"

    def __init__(self, block: Tensor):
        self.block = block

    def edges(self, frame: GraphFrame) -> LayerEdges:  # converted once (export, analysis)
        return frame.cached(("edges", id(self)), lambda: frame.block_to_edges(self.block))

    def num_edges(self, frame: GraphFrame) -> int:
        if ("edges", id(self)) in frame.cache:
            return int(self.edges(frame)[0].size(1))
        return int(torch.count_nonzero(self.block))

    def propagate(self, frame: GraphFrame, x: Tensor) -> Tensor:
        s = frame.sequences
        return dense_head_propagate(x, self.block, s.ptr, s.position, s.batch)

    def dense(self, frame: GraphFrame) -> Tensor:
        return self.block

    def within(self, frame: GraphFrame, max_distance: int) -> "DenseStorage":
        return DenseStorage(frame.cut_block(self.block, max_distance))

    def apply(self, fn) -> "DenseStorage":
        return DenseStorage(fn(self.block))

    def __repr__(self) -> str:
        return f"DenseStorage(block={tuple(self.block.shape)})"


# How the fused layout propagates on the CPU without gradients, outside bfloat16 autocast:
# "blocks" (:func:`glomo_pyg.graphs.score_blocks.propagate_scores`: faster there than FlexAttention,
# and no compiler; benchmarks/results/speed.md, "Transfer on the CPU") or "flex".
CPU_PROPAGATION = "blocks"


class FusedStorage(GraphStorage):
    """The augmented ``[B, H, T, D]`` keys and queries whose inner products are the
    layer's scores, propagated by FlexAttention (:mod:`glomo_pyg.flex`), or along the
    edges where it has no backward. ``window``: the longest edge kept."""

    layout = "fused"

    def __init__(self, keys: Tensor, queries: Tensor, normalization: str = "relu2",
                 window: Optional[int] = None):
        self.keys, self.queries = keys, queries
        self.normalization = normalization
        self.window = window

    def edges(self, frame: GraphFrame) -> LayerEdges:
        def emit():
            s = frame.sequences
            frame.check_size("sparse", "These fused graphs were asked for their edges (export, "
                                       "analysis, or propagation on CPU with gradients). ")
            edges = latent_graph_edges(self.keys, self.queries, s.lengths, s.ptr,
                                       direction=frame.direction,
                                       include_self=frame.include_self,
                                       normalization=self.normalization, check=False,
                                       sizes=s.sizes)
            return edges if self.window is None else frame.cut_edges(edges, self.window)

        return frame.cached(("edges", id(self)), emit)

    def dense(self, frame: GraphFrame) -> Tensor:
        frame.check_size("dense")
        block = latent_graph_dense(self.keys, self.queries, frame.sequences.lengths,
                                   direction=frame.direction, include_self=frame.include_self,
                                   normalization=self.normalization, check=False)
        return block if self.window is None else frame.cut_block(block, self.window)

    def propagate(self, frame: GraphFrame, x: Tensor) -> Tensor:
        if flex.needs_fallback(self.keys, self.queries, x):
            return frame.propagate_edges(self, self.edges(frame), x, True)
        s = frame.sequences
        xs = x.unsqueeze(0) if x.dim() == 2 else x  # [H or 1, N, C]
        b, t = s.num_sequences, s.max_len
        if x.device.type == "cpu" and CPU_PROPAGATION == "blocks" and \
                autocast_half_dtype("cpu") is None:  # (bfloat16 autocast: FlexAttention's)
            values = xs.reshape(xs.size(0), b, t, xs.size(-1)).transpose(0, 1) \
                if s.num_nodes == b * t else s.to_padded(xs.transpose(0, 1)).permute(0, 2, 1, 3)
            out = propagate_scores(self.keys, self.queries, values, s.lengths,
                                   order=frame.order, normalization=self.normalization,
                                   window=self.window)  # [B, H, T, C]
            return s.to_flat(out.transpose(1, 2)).transpose(0, 1) if s.num_nodes != b * t \
                else out.transpose(0, 1).reshape(frame.num_heads, b * t, out.size(-1))
        padded_len = -(-t // flex.BLOCK) * flex.BLOCK
        if s.num_nodes == b * t and (self.normalization == "relu2" or padded_len == t):
            return self._propagate_full(frame, xs, padded_len)
        padded = s.to_padded(xs.transpose(0, 1)).permute(0, 2, 1, 3)  # [B, H|1, T, C]
        # one block mask serves every layer and call
        mask = frame.cached(("flex-mask", self.window, self.normalization), lambda: flex.block_mask(
            s.lengths, padded_len, frame.direction, frame.include_self,
            order_only=self.normalization == "relu2", **self._flex_window(frame)))
        out = flex.fused_propagate(self.keys, self.queries, padded, s.lengths,
                                   direction=frame.direction, include_self=frame.include_self,
                                   normalization=self.normalization, mask=mask,
                                   full_length=False, check=False)  # [B, H, T, C]
        return s.to_flat(out.permute(0, 2, 1, 3)).transpose(0, 1)  # [H, N, C]

    def propagate_head_mean(self, frame: GraphFrame, x: Tensor) -> Tensor:
        s = frame.sequences
        b, t = s.num_sequences, s.max_len
        if x.device.type != "cpu" or CPU_PROPAGATION != "blocks" or x.requires_grad or \
                torch.is_grad_enabled() and self.keys.requires_grad or \
                autocast_half_dtype("cpu") is not None:
            return super().propagate_head_mean(frame, x)
        x = x[0] if x.dim() == 3 else x
        values = x.reshape(1, b, t, -1).transpose(0, 1) if s.num_nodes == b * t else \
            s.to_padded(x).unsqueeze(1)  # [B, 1, T, C]
        out = propagate_scores(self.keys, self.queries, values, s.lengths, order=frame.order,
                               normalization=self.normalization, window=self.window,
                               mean_heads=True)  # [B, 1, T, C]
        return s.to_flat(out[:, 0]).unsqueeze(0)

    def _flex_window(self, frame: GraphFrame) -> Dict[str, Optional[int]]:
        """The window as :func:`glomo_pyg.flex.block_mask` takes it."""
        grid = isinstance(frame.explicit_order, RasterOrder) and self.window is not None
        return dict(window=self.window,
                    grid_width=cast(RasterOrder, frame.explicit_order).width if grid else None)

    def _propagate_full(self, frame: GraphFrame, xs: Tensor, padded_len: int) -> Tensor:
        """Every sequence fills ``T`` (e.g. whole images): one order mask of batch 1."""
        # sequences stay in FlexAttention's dynamic batch dimension (design.md)
        s = frame.sequences
        b, t, h = s.num_sequences, s.max_len, frame.num_heads
        full = torch.full((1,), t, dtype=torch.long, device=xs.device)
        mask = frame.cached(("flex-order-mask", self.window), lambda: flex.block_mask(
            full, padded_len, frame.direction, frame.include_self, order_only=True,
            **self._flex_window(frame)))
        values = xs.reshape(xs.size(0), b, t, xs.size(-1)).transpose(0, 1)  # [B, H|1, T, C]
        out = flex.fused_propagate(self.keys, self.queries, values, full.expand(b),
                                   direction=frame.direction, include_self=frame.include_self,
                                   normalization=self.normalization, mask=mask,
                                   full_length=True, check=False)  # [B, H, T, C]
        return out.transpose(0, 1).reshape(h, b * t, out.size(-1))

    def within(self, frame: GraphFrame, max_distance: int) -> "FusedStorage":
        window = max_distance if self.window is None else min(self.window, max_distance)
        return FusedStorage(self.keys, self.queries, self.normalization, window)

    def apply(self, fn) -> "FusedStorage":
        return FusedStorage(fn(self.keys), fn(self.queries), self.normalization, self.window)

    def __repr__(self) -> str:
        return (f"FusedStorage(keys={tuple(self.keys.shape)}, normalization="
                f"'{self.normalization}'" + (f", window={self.window}" if self.window else "")
                + ")")


class UniformStorage(GraphStorage):
    """The uniform baseline: every allowed source of a target (within ``window``) gets
    ``1 / number of such sources``; O(N) prefix (or box) means, edges built on demand."""

    layout = "sparse"  # as seen by users: edges (built on demand) are what export sees

    def __init__(self, window: Optional[int] = None):
        self.window = window

    def counts(self, frame: GraphFrame) -> Tensor:
        """``[N]`` sources of each target (within the window if any)."""
        seqs = frame.sequences
        count = SequenceOrder(frame.direction, frame.include_self).num_sources(
            seqs.position, seqs.lengths[seqs.batch])
        if self.window is None:
            return count
        extra = int(frame.include_self)  # the unit itself is at distance 0
        o = frame.explicit_order
        if not isinstance(o, RasterOrder):
            return (count - extra).clamp(max=self.window) + extra
        d = self.window  # the window's rows before, and its row's left part
        pos = seqs.position if frame.direction == "forward" else o.num_units - 1 - seqs.position
        r, c = torch.div(pos, o.width, rounding_mode="floor"), pos % o.width
        cols = (c + d).clamp(max=o.width - 1) + 1 - (c - d).clamp(min=0)
        return r.clamp(max=d) * cols + c.clamp(max=d) + extra

    def edges(self, frame: GraphFrame) -> LayerEdges:
        def build():
            frame.check_size("sparse", "Uniform graphs propagate in O(N); only their edges "
                                       "(export, analysis) are this large. ")
            seqs, h = frame.sequences, frame.num_heads
            src, tgt = SequenceOrder(frame.direction, frame.include_self).pairs(seqs.ptr)
            count = self.counts(frame)
            if self.window is not None:
                near = frame.near(tgt, src, self.window)
                src, tgt = src[near], tgt[near]
            weight = (1.0 / count.clamp(min=1).double()).float()[tgt]
            edges = torch.stack([src, tgt]).repeat(1, h)
            heads = torch.arange(h, device=seqs.ptr.device).repeat_interleave(tgt.numel())
            return edges, weight.repeat(h), heads

        return frame.cached(("uniform-edges", self.window), build)

    def num_edges(self, frame: GraphFrame) -> int:
        if ("uniform-edges", self.window) in frame.cache:
            return int(self.edges(frame)[0].size(1))
        return int(self.counts(frame).sum()) * frame.num_heads

    def propagate(self, frame: GraphFrame, x: Tensor) -> Tensor:
        """The mean over each target's allowed sources, from per-sequence prefix sums
        (float64, so long sequences stay exact)."""
        seqs = frame.sequences
        xs = x.unsqueeze(0) if x.dim() == 2 else x  # [H or 1, N, C]
        if self.window is not None and isinstance(frame.explicit_order, RasterOrder):
            out = self._propagate_grid(frame, xs).to(x.dtype)
            return out.expand(frame.num_heads, -1, -1) if out.size(0) == 1 else out
        csum = torch.nn.functional.pad(xs.double().cumsum(1), (0, 0, 1, 0))  # [., N + 1, C]
        node = torch.arange(seqs.num_nodes, device=x.device)
        start = seqs.ptr[seqs.batch]
        end = start + seqs.lengths[seqs.batch]
        extra = int(frame.include_self)
        if frame.direction == "forward":  # sources start .. node - 1 (+ node)
            lo, hi = start, node + extra
            if self.window is not None:
                lo = torch.maximum(lo, node - self.window)
        else:  # sources node + 1 (node) .. end - 1
            lo, hi = node + 1 - extra, end
            if self.window is not None:
                hi = torch.minimum(hi, node + 1 + self.window)
        count = (hi - lo).clamp_min(0)
        total = csum[:, hi] - csum[:, lo]
        out = total / count.clamp_min(1).view(1, -1, 1).double()
        out = out.to(x.dtype)
        return out.expand(frame.num_heads, -1, -1) if out.size(0) == 1 else out

    def _propagate_grid(self, frame: GraphFrame, xs: Tensor) -> Tensor:
        """Box means over whole raster-ordered images (backward: rotated by 180 degrees)."""
        # (only for a window over raster-ordered images)
        o, d, extra = cast(RasterOrder, frame.explicit_order), self.window, int(frame.include_self)
        assert d is not None
        b, hh, ww = frame.sequences.num_sequences, o.height, o.width
        grid = xs.double().reshape(xs.size(0), b, hh, ww, xs.size(-1))
        if frame.direction == "backward":
            grid = grid.flip(2, 3)
        integral = torch.nn.functional.pad(grid.cumsum(2).cumsum(3), (0, 0, 1, 0, 1, 0))
        r = torch.arange(hh, device=xs.device).view(-1, 1)
        c = torch.arange(ww, device=xs.device).view(1, -1)
        c0, c1 = (c - d).clamp(min=0), (c + d).clamp(max=ww - 1) + 1  # [c0, c1)
        r0 = (r - d).clamp(min=0)

        def box(top, bottom, left, right):  # sum over rows [top, bottom), columns [left, right)
            return (integral[:, :, bottom, right] - integral[:, :, top, right]
                    - integral[:, :, bottom, left] + integral[:, :, top, left])

        total = box(r0, r, c0, c1) + box(r, r + 1, c0, c + extra)
        count = (r - r0) * (c1 - c0) + (c + extra - c0)
        out = total / count.clamp(min=1).unsqueeze(-1).double()
        if frame.direction == "backward":
            out = out.flip(2, 3)
        return out.reshape(xs.size(0), b * hh * ww, xs.size(-1))

    def within(self, frame: GraphFrame, max_distance: int) -> "UniformStorage":
        return UniformStorage(max_distance if self.window is None
                              else min(self.window, max_distance))

    def apply(self, fn) -> "UniformStorage":
        return self  # no tensors: the frame carries the batch

    def __repr__(self) -> str:
        return "UniformStorage(" + (f"window={self.window}" if self.window else "") + ")"


class HeadMeanStorage(GraphStorage):
    r"""One layer's graphs averaged over its ``heads``,
    :math:`\bar G = \frac{1}{H} \sum_h G^{(h)}`, as a one-head layer over the storage
    ``inner`` of the :math:`H` heads (:meth:`LatentGraphs.mean_heads`); fused layers
    propagate it with one product per block instead of one per head."""

    def __init__(self, inner: GraphStorage, heads: int):
        self.inner, self.heads = inner, int(heads)
        self.layout = inner.layout

    def inner_frame(self, frame: GraphFrame) -> GraphFrame:
        """The one-head ``frame`` with the inner storage's heads (cached in it)."""
        return frame.cached(("head-mean-frame", self.heads), lambda: GraphFrame(
            frame.sequences, self.heads, frame.direction, frame.include_self,
            frame.explicit_order))

    @property
    def normalization(self) -> str:
        return getattr(self.inner, "normalization", "relu2")

    @property
    def window(self) -> Optional[int]:
        return getattr(self.inner, "window", None)

    def propagate(self, frame: GraphFrame, x: Tensor) -> Tensor:
        return self.inner.propagate_head_mean(self.inner_frame(frame), x)

    def edges(self, frame: GraphFrame) -> LayerEdges:
        def merge():
            (src, tgt), w, _ = self.inner.edges(self.inner_frame(frame))
            n = frame.num_nodes
            pair, inverse = torch.unique(tgt * n + src, return_inverse=True)  # sorted
            weight = w.new_zeros(pair.numel()).index_add_(0, inverse, w / self.heads)
            index = torch.stack([pair % n, torch.div(pair, n, rounding_mode="floor")])
            return index, weight, torch.zeros_like(pair)

        return frame.cached(("head-mean-edges", id(self)), merge)

    def dense(self, frame: GraphFrame) -> Tensor:
        return self.inner.dense(self.inner_frame(frame)).mean(1, keepdim=True)

    def within(self, frame: GraphFrame, max_distance: int) -> "HeadMeanStorage":
        return HeadMeanStorage(self.inner.within(self.inner_frame(frame), max_distance),
                               self.heads)

    def apply(self, fn) -> "HeadMeanStorage":
        return HeadMeanStorage(self.inner.apply(fn), self.heads)

    def __repr__(self) -> str:
        return f"HeadMeanStorage({self.inner!r}, heads={self.heads})"
