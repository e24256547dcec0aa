"""The one graph object of the library: a stack of latent graphs over a batch, and
the pair of them (forward, backward) a bidirectional predictor emits."""
from __future__ import annotations

import operator
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from glomo_pyg import flex, graph_conversion, sequences
from glomo_pyg.kernels import (blocked_propagate, check_graph_size, dense_head_propagate,
                               head_blocked_edges, latent_graph_dense, latent_graph_edges)
from glomo_pyg.ordering import DIRECTIONS, RasterOrder, SequenceOrder, UnitOrder
from glomo_pyg.sequences import SequenceBatch

# far beyond any model (the paper: 3 layers of 8 heads); per-head statistics allocate
# [layers, heads, units] tensors, so absurd counts are refused before they are used
MAX_HEADS = 4096
MAX_LAYERS = 4096

LayerEdges = Tuple[Tensor, Tensor, Tensor]
# Short keys of the two directions, for ModuleDicts ('forward' is a Module method) and
# the saved weights' names.
DIRECTION_KEYS = {"forward": "fw", "backward": "bw"}


def _check_fixed_graphs(direction: str, num_layers: int, num_heads: int) -> None:
    """The arguments of the graphs built without a predictor (uniform, adjacent)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be 'forward' or 'backward', got {direction!r}")
    for name, value, high in (("num_layers", num_layers, MAX_LAYERS),
                              ("num_heads", num_heads, MAX_HEADS)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
            raise ValueError(f"{name} must be an integer in [1, {high}], got {value!r}")


class LatentGraphs:
    r"""Sparse weighted graphs emitted by a graph predictor (paper Sec. 2.1, Eq. 1).

    For every graph layer ``l`` the edges of all heads and all sequences of the
    batch are stored together:

    * ``edge_index[l]``: ``[2, E_l]`` int64, row 0 the source ``i``, row 1 the
      target ``j``, as flat node ids ``0..N-1`` (PyG's ``source_to_target``);
    * ``edge_weight[l]``: ``[E_l]``, :math:`G^{l,h}_{ij} > 0`;
    * ``edge_head[l]``: ``[E_l]`` head id of each edge.

    Emitted edges are sorted by ``(head, target, source)``, so a CSR adjacency
    needs no sort (hand-built edges may come in any order: they are sorted once,
    when first propagated). Per (layer, head, target) the incoming weights sum
    to 1, or the target has no incoming edge. No edge touches padding or
    crosses sequences.

    The constructor validates what it is given (dtypes, shapes, devices, ids and
    heads in range, edges inside one sequence, finite non-negative weights), so
    no graph that reaches a sparse kernel can make it read out of bounds.

    Three layouts hold the same graphs (:attr:`layout`): ``'sparse'``, the pruned
    edge lists above; ``'dense'`` (:meth:`from_dense`), one padded
    ``[B, H, T, T]`` block per layer with ``[b, h, i, j] = G_ij``, which is
    faster to aggregate over short sequences and dense graphs; and ``'fused'``,
    each layer kept as the augmented keys and queries it is scored from, so that
    propagation scores, normalises and aggregates in one FlexAttention call that
    never forms ``T x T`` (:mod:`glomo_pyg.flex`; where FlexAttention cannot run a
    backward, on CPU with gradients, it falls back to the sparse edges).
    :meth:`to_sparse` / :meth:`to_dense_layout` convert. :meth:`propagate` is
    the one place that multiplies features by a graph layer, in whichever
    layout it is stored (caching the sparse product's index arrays); every
    layer of glomo_pyg propagates through it. Export and analysis
    (``edge_index``, :meth:`layer`, :meth:`to_networkx`, ...) always see
    sparse edges, converted on demand.

    Args:
        edge_index, edge_weight, edge_head: one tensor per layer.
        num_heads: heads per layer.
        direction: ``'forward'`` (sources precede targets) or ``'backward'``.
        ptr: ``[B + 1]`` offsets of the sequences in the flat node order.
        include_self: whether ``i = j`` edges were allowed.
    """

    def __init__(self, edge_index: List[Tensor], edge_weight: List[Tensor], edge_head: List[Tensor],
                 *, num_heads: int, direction: str, ptr: Tensor, include_self: bool = False,
                 order: Optional[UnitOrder] = None):
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be 'forward' or 'backward', got {direction!r}")
        if not isinstance(num_heads, int) or isinstance(num_heads, bool) or \
                not 1 <= num_heads <= MAX_HEADS:
            raise ValueError(f"num_heads must be an integer in [1, {MAX_HEADS}], got "
                             f"{num_heads!r}")
        edge_index, edge_weight, edge_head = list(edge_index), list(edge_weight), list(edge_head)
        if not (len(edge_index) == len(edge_weight) == len(edge_head)):
            raise ValueError("edge_index, edge_weight and edge_head need one entry per layer each")
        if not edge_index:
            raise ValueError("graphs need at least one layer")
        sequences = _check_ptr(ptr)
        for l, (ei, ew, eh) in enumerate(zip(edge_index, edge_weight, edge_head)):
            _check_layer(l, ei, ew, eh, sequences, num_heads,
                         SequenceOrder(direction, include_self))
        self._init(edge_index, edge_weight, edge_head, num_heads, direction, sequences,
                   include_self, sorted_edges=False)
        self.with_order(order)

    def _init(self, edge_index, edge_weight, edge_head, num_heads, direction, sequences,
              include_self, sorted_edges, dense=None, fused=None, normalization="relu2"):
        self._edges: Optional[List[LayerEdges]] = None if dense is not None or \
            fused is not None else list(zip(edge_index, edge_weight, edge_head))
        self._dense: Optional[List[Tensor]] = dense
        # fused layout: per layer the augmented [B, H, T, D] keys and queries
        self._fused: Optional[List[Tuple[Tensor, Tensor]]] = fused
        self._normalization = normalization
        self._flex_cache: Dict[str, object] = {}
        self._sorted = sorted_edges  # edges known to be in (head, target, source) order
        self._blocked: Dict[Tuple[int, bool], Tuple[Tensor, Tensor, Tensor]] = {}
        self.num_heads = int(num_heads)
        self.direction = direction
        self.include_self = bool(include_self)
        self.sequences = sequences
        self._order: Optional[UnitOrder] = None  # None: the 1-D SequenceOrder
        self._uniform_layers: Optional[int] = None  # uniform graphs: layers, edges lazy
        # longest edge kept (within()): uniform and fused graphs apply it lazily
        self._window: Optional[int] = None

    def with_order(self, order: Optional[UnitOrder]) -> "LatentGraphs":
        """Attach the allowed-sources rule these graphs were emitted under (e.g. a
        :class:`~glomo_pyg.ordering.RasterOrder` with its grid); returns ``self``. For
        emitters: the order must match the graphs' direction and ``include_self``."""
        if order is None:
            return self
        if not isinstance(order, UnitOrder):
            raise TypeError(f"order must be a UnitOrder, got {type(order).__name__}")
        if (order.direction, order.include_self) != (self.direction, self.include_self):
            raise ValueError(f"order {order!r} does not match the graphs' direction "
                             f"{self.direction!r} and include_self={self.include_self}")
        if not isinstance(order, SequenceOrder):
            raise ValueError("the kernels mask sources by position in the sequence: the order "
                             f"must be a SequenceOrder (e.g. RasterOrder), got {order!r}")
        units = getattr(order, "num_units", None)
        if units is not None and self.num_sequences and \
                bool((self.sequences.lengths != units).any()):
            raise ValueError(f"{order!r} covers {units} units per image; every sequence must "
                             f"have exactly that many (lengths "
                             f"{sorted(set(self.sequences.lengths.tolist()))[:5]})")
        self._order = order
        return self

    @classmethod
    def from_trusted_edges(cls, edge_index: List[Tensor], edge_weight: List[Tensor],
                           edge_head: List[Tensor], *, num_heads: int, direction: str,
                           sequences: SequenceBatch, include_self: bool = False
                           ) -> "LatentGraphs":
        """Graphs in the sparse layout from edges that code built itself (emitted,
        converted, moved): valid and sorted by (head, target) by construction, so
        **nothing is checked** and nothing syncs with the device. For library code and
        emitters; anything else builds graphs with the constructor, which validates."""
        graphs = cls.__new__(cls)
        graphs._init(list(edge_index), list(edge_weight), list(edge_head), num_heads, direction,
                     sequences, include_self, sorted_edges=True)
        return graphs

    @classmethod
    def from_trusted_dense(cls, blocks: List[Tensor], *, direction: str,
                           sequences: SequenceBatch, include_self: bool = False
                           ) -> "LatentGraphs":
        """Graphs in the dense layout from ``[B, H, T, T]`` blocks that code built itself,
        unchecked (:meth:`from_trusted_edges`); :meth:`from_dense` validates."""
        graphs = cls.__new__(cls)
        graphs._init([], [], [], blocks[0].shape[1], direction, sequences, include_self,
                     sorted_edges=True, dense=list(blocks))
        return graphs

    @classmethod
    def from_trusted_fused(cls, layers: List[Tuple[Tensor, Tensor]], *, direction: str,
                           sequences: SequenceBatch, include_self: bool = False,
                           normalization: str = "relu2") -> "LatentGraphs":
        """Graphs in the fused layout: per layer the augmented ``[B, H, T, D]`` keys and
        queries whose inner products are the scores of paper Eq. 1 (``normalization``
        ``'relu2'`` or ``'softmax'``), unchecked (:meth:`from_trusted_edges`): an emitter
        checks them before (``flex.check_fusable``)."""
        graphs = cls.__new__(cls)
        graphs._init([], [], [], layers[0][0].shape[1], direction, sequences, include_self,
                     sorted_edges=True, fused=list(layers), normalization=normalization)
        return graphs

    @classmethod
    def from_dense(cls, dense: Union[Tensor, Sequence[Tensor]], *, direction: str, ptr: Tensor,
                   include_self: bool = False) -> "LatentGraphs":
        """Graphs in the dense layout: one ``[B, H, T, T]`` block per layer with
        ``[b, h, i, j] = G_ij`` (``T`` the longest sequence), zero at padding and
        at absent edges. ``dense`` is a list of blocks or an ``[L, B, H, T, T]``
        tensor. Weights must be finite, non-negative, and zero outside the pairs the
        direction allows (:class:`ValueError` otherwise)."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be 'forward' or 'backward', got {direction!r}")
        blocks = list(dense.unbind(0)) if isinstance(dense, Tensor) else list(dense)
        if not blocks:
            raise ValueError("dense graphs need at least one layer")
        seqs = _check_ptr(ptr)
        shape = getattr(blocks[0], "shape", None)
        for l, block in enumerate(blocks):
            if not isinstance(block, Tensor) or not block.dtype.is_floating_point or \
                    block.dim() != 4 or block.shape != shape or \
                    block.shape[0] != seqs.num_sequences or block.shape[1] < 1 or \
                    block.shape[2:] != (seqs.max_len, seqs.max_len):
                raise ValueError(f"layer {l}: dense graphs must be float [B, H, T, T] with B = "
                                 f"{seqs.num_sequences}, T = {seqs.max_len}, the same for every "
                                 f"layer; got {tuple(getattr(block, 'shape', ()))}")
            if block.device != seqs.ptr.device:
                raise ValueError(f"layer {l}: dense graphs are on {block.device}, ptr on "
                                 f"{seqs.ptr.device}")
        # weight outside the allowed (source, target) pairs of each sequence, e.g. at
        # padding, would become edges between sequences or past the last unit
        allowed = SequenceOrder(direction, include_self).block_mask(
            0, seqs.max_len, 0, seqs.max_len, seqs.lengths).transpose(1, 2).unsqueeze(1)
        bad = torch.stack([(~torch.isfinite(block)).any() | (block < 0).any()
                           for block in blocks] +
                          [(block.masked_fill(allowed, 0) != 0).any() for block in blocks]
                          ).tolist()  # one device sync for all layers
        if any(bad[:len(blocks)]):
            raise ValueError(f"layer {bad.index(True)}: dense graph weights must be finite and "
                             f"non-negative")
        if any(bad[len(blocks):]):
            raise ValueError(f"layer {bad[len(blocks):].index(True)}: dense graphs must be zero "
                             f"outside each sequence's allowed (source, target) pairs: at "
                             f"padding, and where the {direction} order (include_self="
                             f"{include_self}) forbids an edge")
        return cls.from_trusted_dense(blocks, direction=direction, sequences=seqs,
                                      include_self=include_self)

    @classmethod
    def uniform(cls, ptr: Tensor, *, num_layers: int, num_heads: int, direction: str,
                include_self: bool = False, order: Optional[UnitOrder] = None
                ) -> "LatentGraphs":
        """The uniform baseline: every allowed source of a target gets the same weight
        (``1 / number of allowed sources``), the same graph for every layer and head.
        Same layout and conventions as emitted graphs (a target with no allowed
        source, e.g. the first unit going forward, gets no edge). Propagation along
        them is a per-sequence prefix (suffix) mean, O(N); the O(T^2) edges are built
        only when asked for (export, analysis, conversion)."""
        _check_fixed_graphs(direction, num_layers, num_heads)
        seqs = _check_ptr(ptr)
        graphs = cls.__new__(cls)
        graphs._init([], [], [], num_heads, direction, seqs, include_self, sorted_edges=True)
        graphs._edges, graphs._uniform_layers = None, int(num_layers)
        return graphs.with_order(order)

    @classmethod
    def adjacent(cls, ptr: Tensor, *, num_layers: int, num_heads: int, direction: str,
                 include_self: bool = False, order: Optional[UnitOrder] = None
                 ) -> "LatentGraphs":
        """The adjacent-unit baseline: each target's one source is its neighbour in the
        sequence (``t - 1`` going forward, ``t + 1`` backward; for pixels in raster order
        the left neighbour, or the last pixel of the row above at a row's start) with
        weight 1, the same graph for every layer and head; the first (last) unit gets no
        edge. Chained over layers (the hierarchical products), layer ``l`` reaches the
        unit ``l + 1`` positions away. Not a graph of the paper: the control that tells
        whether learned graphs transfer more than locality (pretrained text graphs often
        put most weight on the neighbour). ``include_self`` and ``order`` only record
        the allowed-sources rule the graphs stand in for."""
        _check_fixed_graphs(direction, num_layers, num_heads)
        seqs = _check_ptr(ptr)
        node = torch.arange(seqs.num_nodes, device=seqs.ptr.device)
        if direction == "forward":
            tgt = node[seqs.position >= 1]
            src = tgt - 1
        else:
            tgt = node[seqs.position < seqs.lengths[seqs.batch] - 1]
            src = tgt + 1
        # (head, target, source) order: targets ascend within each head
        edges = torch.stack([src, tgt]).repeat(1, num_heads)
        heads = torch.arange(num_heads, device=node.device).repeat_interleave(tgt.numel())
        weight = torch.ones(edges.size(1), device=node.device, dtype=torch.float32)
        return cls.from_trusted_edges([edges] * num_layers, [weight] * num_layers,
                                      [heads] * num_layers, num_heads=num_heads,
                                      direction=direction, sequences=seqs,
                                      include_self=include_self).with_order(order)

    def _uniform_edges(self) -> LayerEdges:
        """The edges of a uniform layer (built on demand: O(T^2) per sequence)."""
        seqs, h = self.sequences, self.num_heads
        rule = SequenceOrder(self.direction, self.include_self)
        src, tgt = rule.pairs(seqs.ptr)
        count = self._uniform_counts()
        if self._window is not None:
            near = self._near(tgt, src, self._window)
            src, tgt = src[near], tgt[near]
        weight = (1.0 / count.clamp(min=1).double()).float()[tgt]
        edges = torch.stack([src, tgt]).repeat(1, h)
        heads = torch.arange(h, device=seqs.ptr.device).repeat_interleave(tgt.numel())
        return edges, weight.repeat(h), heads

    def _uniform_counts(self) -> Tensor:
        """``[N]`` sources of each target in uniform graphs (within the window if any)."""
        seqs = self.sequences
        count = SequenceOrder(self.direction, self.include_self).num_sources(
            seqs.position, seqs.lengths[seqs.batch])
        if self._window is None:
            return count
        extra = int(self.include_self)  # the unit itself is at distance 0
        if not isinstance(self._order, RasterOrder):
            return (count - extra).clamp(max=self._window) + extra
        o, d = self._order, self._window  # the window's rows before, and its row's left part
        pos = seqs.position if self.direction == "forward" else o.num_units - 1 - seqs.position
        r, c = torch.div(pos, o.width, rounding_mode="floor"), pos % o.width
        cols = (c + d).clamp(max=o.width - 1) + 1 - (c - d).clamp(min=0)
        return r.clamp(max=d) * cols + c.clamp(max=d) + extra

    def _propagate_uniform(self, x: Tensor) -> Tensor:
        """Propagation along uniform graphs in O(N): the mean over each target's allowed
        sources, from per-sequence prefix sums (float64, so long sequences stay exact)."""
        seqs = self.sequences
        xs = x.unsqueeze(0) if x.dim() == 2 else x  # [H or 1, N, C]
        if self._window is not None and isinstance(self._order, RasterOrder):
            out = self._propagate_uniform_grid(xs).to(x.dtype)
            return out.expand(self.num_heads, -1, -1) if out.size(0) == 1 else out
        csum = torch.nn.functional.pad(xs.double().cumsum(1), (0, 0, 1, 0))  # [., N + 1, C]
        node = torch.arange(seqs.num_nodes, device=x.device)
        start = seqs.ptr[seqs.batch]
        end = start + seqs.lengths[seqs.batch]
        extra = int(self.include_self)
        if self.direction == "forward":  # sources start .. node - 1 (+ node)
            lo, hi = start, node + extra
            if self._window is not None:
                lo = torch.maximum(lo, node - self._window)
        else:  # sources node + 1 (node) .. end - 1
            lo, hi = node + 1 - extra, end
            if self._window is not None:
                hi = torch.minimum(hi, node + 1 + self._window)
        count = (hi - lo).clamp_min(0)
        total = csum[:, hi] - csum[:, lo]
        out = total / count.clamp_min(1).view(1, -1, 1).double()
        out = out.to(x.dtype)
        return out.expand(self.num_heads, -1, -1) if out.size(0) == 1 else out

    def _propagate_uniform_grid(self, xs: Tensor) -> Tensor:
        """Uniform propagation over a square window of whole images in raster order, in
        O(N): box sums of a per-image integral image (float64). A forward target's
        windowed sources are the window's rows above it and its own row's pixels to the
        left; backward graphs are the forward graphs of the image rotated by 180 degrees,
        i.e. of the reversed raster sequence."""
        o, d, extra = self._order, self._window, int(self.include_self)
        b, hh, ww = self.num_sequences, o.height, o.width
        grid = xs.double().reshape(xs.size(0), b, hh, ww, xs.size(-1))
        if self.direction == "backward":
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
        if self.direction == "backward":
            out = out.flip(2, 3)
        return out.reshape(xs.size(0), b * hh * ww, xs.size(-1))

    # --- storage ------------------------------------------------------------------
    @property
    def layout(self) -> str:
        """``'sparse'`` (pruned edge lists), ``'dense'`` (per-sequence blocks) or
        ``'fused'`` (keys and queries, propagated by FlexAttention)."""
        if self._fused is not None:
            return "fused"
        return "dense" if self._dense is not None else "sparse"

    @property
    def fused_layers(self) -> Optional[List[Tuple[Tensor, Tensor]]]:
        """Fused layout: per layer the augmented ``[B, H, T, D]`` (keys, queries) whose
        inner products are the graph scores; ``None`` in the other layouts."""
        return None if self._fused is None else list(self._fused)

    @property
    def normalization(self) -> str:
        """How scores become weights: ``'relu2'`` (paper Eq. 1, squared ReLU) or
        ``'softmax'`` (the "-sparse" ablation)."""
        return self._normalization

    @property
    def order(self) -> UnitOrder:
        """The allowed-sources rule of these graphs (:mod:`glomo_pyg.ordering`): a
        :class:`~glomo_pyg.ordering.RasterOrder` for pixel graphs, else the 1-D order."""
        if self._order is not None:
            return self._order
        return SequenceOrder(self.direction, self.include_self)

    def _check_size(self, layout: str, hint: str = "") -> None:
        """Refuse before converting to ``layout`` what one layer could not hold
        (:data:`~glomo_pyg.kernels.MAX_GRAPH_PAIRS`; host arithmetic, no sync)."""
        s = self.sequences
        check_graph_size(layout, s.num_sequences, s.num_nodes, s.max_len, self.num_heads,
                         self.include_self, hint)

    def _sparse_edges(self) -> List[LayerEdges]:
        if self._edges is None and self._fused is not None:  # emitted once, on demand
            s = self.sequences
            self._check_size("sparse", "These fused graphs were asked for their edges (export, "
                                       "analysis, or propagation where FlexAttention has no "
                                       "backward, e.g. on CPU with gradients). ")
            self._edges = [latent_graph_edges(k, q, s.lengths, s.ptr, direction=self.direction,
                                              include_self=self.include_self,
                                              normalization=self._normalization, check=False)
                           for k, q in self._fused]
            if self._window is not None:
                self._edges = [self._cut_edges(e, self._window) for e in self._edges]
        if self._edges is None and self._uniform_layers is not None:
            self._check_size("sparse", "Uniform graphs propagate in O(N); only their edges "
                                       "(export, analysis) are this large. ")
            self._edges = [self._uniform_edges()] * self._uniform_layers
        if self._edges is None:  # dense layout: converted once, on demand (export, analysis)
            self._edges = [self._block_to_edges(block) for block in self._dense]
        return self._edges

    def _block_to_edges(self, block: Tensor) -> LayerEdges:
        # (h, b, j, i) order = (head, flat target, source) order, as emitted graphs are sorted
        h, b, j, i = (block.transpose(-1, -2).transpose(0, 1) != 0).nonzero(as_tuple=True)
        offset = self.ptr[b]
        return torch.stack([offset + i, offset + j]), block[b, h, i, j], h

    @property
    def edge_index(self) -> List[Tensor]:
        return [e[0] for e in self._sparse_edges()]

    @property
    def edge_weight(self) -> List[Tensor]:
        return [e[1] for e in self._sparse_edges()]

    @property
    def edge_head(self) -> List[Tensor]:
        return [e[2] for e in self._sparse_edges()]

    def dense_layer(self, l: int) -> Tensor:
        """``[B, H, T, T]`` block of layer ``l`` (``[b, h, i, j] = G_ij``), converted
        from the edges in the sparse layout (differentiable either way)."""
        l = self._layer_index(l)
        if self._dense is not None:
            return self._dense[l]
        if self._fused is not None:
            self._check_size("dense")
            k, q = self._fused[l]
            block = latent_graph_dense(k, q, self.lengths, direction=self.direction,
                                       include_self=self.include_self,
                                       normalization=self._normalization, check=False)
            return block if self._window is None else self._cut_block(block, self._window)
        return self.to_dense(layer=l)

    def to_sparse(self) -> "LatentGraphs":
        """The same graphs in the sparse layout (``self`` if already sparse)."""
        if self.layout == "sparse":
            return self
        return LatentGraphs.from_trusted_edges(
            self.edge_index, self.edge_weight, self.edge_head, num_heads=self.num_heads,
            direction=self.direction, sequences=self.sequences, include_self=self.include_self
        ).with_order(self._order)

    def to_dense_layout(self) -> "LatentGraphs":
        """The same graphs in the dense layout (``self`` if already dense)."""
        if self.layout == "dense":
            return self
        return LatentGraphs.from_trusted_dense(
            [self.dense_layer(l) for l in range(self.num_layers)], direction=self.direction,
            sequences=self.sequences, include_self=self.include_self).with_order(self._order)

    # --- propagation --------------------------------------------------------------
    def propagate(self, x: Tensor, layer: int) -> Tensor:
        r"""Per-head propagation along graph layer ``layer``:
        :math:`P^{(h)}_j = \sum_i G^{l,h}_{ij}\, x^{(h)}_i`.

        ``x`` is ``[N, C]`` (every head propagates the same features) or ``[H, N, C]``
        (head ``h`` propagates ``x[h]``, as in a chain :math:`G^1 G^2 \cdots`); the
        result is ``[H, N, C]``. Sparse layout: one CSR product over all heads, whose
        head-blocked index arrays are built once per layer and input kind and then
        reused; dense layout: batched matmuls over the blocks. Differentiable with
        respect to ``x`` and the edge weights. The shape of ``x`` is checked (on the
        host, no device sync): the sparse kernels index rows by node id, so a wrong row
        count would read and write out of bounds; its values are trusted (callers
        validate them at their door)."""
        if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() not in (2, 3) or \
                x.size(-2) != self.num_nodes or (x.dim() == 3 and x.size(0) != self.num_heads):
            raise ValueError(f"x must be floating-point [N, C] or [H, N, C] with N = "
                             f"{self.num_nodes} units and H = {self.num_heads} heads, got "
                             f"{getattr(x, 'dtype', type(x).__name__)} "
                             f"{tuple(getattr(x, 'shape', ()))}")
        layer = self._layer_index(layer)
        if self._dense is not None:
            seqs = self.sequences
            return dense_head_propagate(x, self._dense[layer], seqs.ptr, seqs.position,
                                        seqs.batch)
        if self._fused is not None and not flex.needs_fallback(*self._fused[layer], x):
            return self._propagate_fused(x, layer)
        if self._uniform_layers is not None:
            return self._propagate_uniform(x)
        shared = x.dim() == 2
        key = (layer, shared)
        if key not in self._blocked:
            ei, ew, eh = self._sparse_edges()[layer]
            self._blocked[key] = head_blocked_edges(ei, ew, eh, self.num_nodes, shared,
                                                    self.num_heads, self._sorted)
        rows, cols, weight = self._blocked[key]
        return blocked_propagate(x, rows, cols, weight.to(x.dtype), self.num_heads)

    def _propagate_fused(self, x: Tensor, layer: int) -> Tensor:
        k, q = self._fused[layer]
        seqs = self.sequences
        xs = x.unsqueeze(0) if x.dim() == 2 else x  # [H or 1, N, C]
        b, t = seqs.num_sequences, seqs.max_len
        padded_len = -(-t // flex.BLOCK) * flex.BLOCK
        if seqs.num_nodes == b * t and (self._normalization == "relu2" or padded_len == t):
            return self._propagate_fused_full(xs, layer, padded_len)
        padded = seqs.to_padded(xs.transpose(0, 1)).permute(0, 2, 1, 3)  # [B, H|1, T, C]
        if "mask" not in self._flex_cache:  # one block mask serves every layer and call
            self._flex_cache["mask"] = flex.block_mask(
                seqs.lengths, padded_len, self.direction, self.include_self,
                order_only=self._normalization == "relu2", **self._flex_window())
        out = flex.fused_propagate(k, q, padded, seqs.lengths, direction=self.direction,
                                   include_self=self.include_self,
                                   normalization=self._normalization,
                                   mask=self._flex_cache["mask"],
                                   full_length=False, check=False)  # [B, H, T, C]
        return seqs.to_flat(out.permute(0, 2, 1, 3)).transpose(0, 1)  # [H, N, C]

    def _flex_window(self) -> Dict[str, Optional[int]]:
        """The window (within()) as :func:`glomo_pyg.flex.block_mask` takes it."""
        grid = isinstance(self._order, RasterOrder)
        return dict(window=self._window,
                    grid_width=self._order.width if grid and self._window is not None else None)

    def _propagate_fused_full(self, xs: Tensor, layer: int, padded_len: int) -> Tensor:
        """Every sequence fills ``T`` (e.g. whole images): allowed pairs then depend on
        positions only, so one order mask of batch 1 serves every sequence and head, and
        no scatter or gather to padded blocks is needed. Sequences stay in FlexAttention's
        batch dimension, which its compiled kernel keeps dynamic; its head dimension is
        specialised, so putting images there recompiled the kernel for every new batch
        size, and after torch's recompilation limit FlexAttention silently ran eagerly."""
        b, t, h = self.num_sequences, self.sequences.max_len, self.num_heads
        k, q = self._fused[layer]  # [B, H, T, D]
        full = torch.full((1,), t, dtype=torch.long, device=xs.device)
        if "order_mask" not in self._flex_cache:
            self._flex_cache["order_mask"] = flex.block_mask(
                full, padded_len, self.direction, self.include_self, order_only=True,
                **self._flex_window())
        values = xs.reshape(xs.size(0), b, t, xs.size(-1)).transpose(0, 1)  # [B, H|1, T, C]
        out = flex.fused_propagate(k, q, values, full.expand(b), direction=self.direction,
                                   include_self=self.include_self,
                                   normalization=self._normalization,
                                   mask=self._flex_cache["order_mask"],
                                   full_length=True, check=False)  # [B, H, T, C]
        return out.transpose(0, 1).reshape(h, b * t, out.size(-1))

    # --- layout -------------------------------------------------------------------
    @property
    def ptr(self) -> Tensor:
        return self.sequences.ptr

    @property
    def batch(self) -> Tensor:
        return self.sequences.batch

    @property
    def lengths(self) -> Tensor:
        return self.sequences.lengths

    @property
    def num_layers(self) -> int:
        if self._fused is not None:
            return len(self._fused)
        if self._uniform_layers is not None:
            return self._uniform_layers
        return len(self._dense) if self._dense is not None else len(self._edges)

    @property
    def num_nodes(self) -> int:
        return self.sequences.num_nodes

    @property
    def num_sequences(self) -> int:
        return self.sequences.num_sequences

    @property
    def num_edges(self) -> List[int]:
        if self._dense is not None and self._edges is None:
            return [int(torch.count_nonzero(block)) for block in self._dense]
        if self._uniform_layers is not None and self._edges is None:
            pairs = int(self._uniform_counts().sum())
            return [pairs * self.num_heads] * self._uniform_layers
        return [ei.size(1) for ei in self.edge_index]

    @property
    def device(self) -> torch.device:
        return self.ptr.device

    def _layer_index(self, l: int) -> int:
        """``l`` as an index in ``0..num_layers - 1`` (negative counts from the end);
        ``IndexError`` naming the valid range otherwise."""
        if isinstance(l, bool) or not isinstance(l, int):
            try:
                l = l.__index__()  # numpy integers, 0-d integer tensors
            except (AttributeError, TypeError, RuntimeError):
                raise TypeError(f"a graph layer index must be an integer, got "
                                f"{type(l).__name__}") from None
        n = self.num_layers
        if not -n <= l < n:
            raise IndexError(f"graph layer {l} is out of range: these graphs have {n} "
                             f"layer{'s' if n != 1 else ''} (0..{n - 1})")
        return l % n

    def layer(self, l: int) -> LayerEdges:
        """``(edge_index, edge_weight, edge_head)`` of graph layer ``l`` (converted from
        the dense blocks in the dense layout); ``IndexError`` outside ``0..L-1``."""
        return self._sparse_edges()[self._layer_index(l)]

    def __iter__(self) -> Iterator[LayerEdges]:
        return (self.layer(l) for l in range(self.num_layers))

    def density(self) -> List[float]:
        """Fraction of allowed (source, target) pairs that carry an edge, per layer."""
        total = float(self.order.num_pairs(self.lengths).sum()) * self.num_heads
        return [e / total if total else 0.0 for e in self.num_edges]

    def column_entropy(self, normalized: bool = True) -> Tensor:
        r"""Entropy of every target's incoming weights, ``[L, H, N]``.

        :math:`H^{l,h}_j = -\sum_i G^{l,h}_{ij} \log G^{l,h}_{ij}` over the target's
        edges (its weights sum to 1); with ``normalized`` divided by
        :math:`\log n_j`, :math:`n_j` its allowed sources, so 1 is uniform over
        what may be attended and 0 a single source. ``NaN`` where it is undefined:
        targets with no incoming edge or fewer than two allowed sources.
        Differentiable w.r.t. the edge weights (graphs in the fused layout are
        asked for their edges).
        """
        s, h_ = self.sequences, self.num_heads
        allowed = self.order.num_sources(s.position, s.lengths[s.batch])  # [N]
        out = []
        for (src, tgt), w, h in self._sparse_edges():
            column = h * s.num_nodes + tgt
            plogp = w * w.clamp_min(torch.finfo(w.dtype).tiny).log()
            entropy = -plogp.new_zeros(h_ * s.num_nodes).index_add(0, column, plogp)
            has_edge = torch.bincount(column, minlength=h_ * s.num_nodes) > 0
            entropy, has_edge = entropy.view(h_, -1), has_edge.view(h_, -1)
            if normalized:  # clamp: no 0/0 in the gradient of the undefined entries
                entropy = entropy / allowed.clamp_min(2).to(entropy.dtype).log()
            defined = has_edge & (allowed >= 2)
            out.append(torch.where(defined, entropy, entropy.new_full((), float("nan"))))
        return torch.stack(out)

    def within(self, max_distance: int) -> "LatentGraphs":
        r"""The graphs with every edge longer than ``max_distance`` removed and each
        target's remaining weights rescaled to the total its weights had before: to
        sum 1 again in emitted graphs (a target whose edges were all longer keeps none;
        graphs with no longer edge come back unchanged).

        Length is :meth:`UnitOrder.window_distance <glomo_pyg.ordering.UnitOrder.window_distance>`:
        ``|i - j|`` units along a sequence; for pixel graphs in raster order the larger
        of the row and column offsets, so that ``max_distance = d`` keeps exactly the
        pairs a ``(d + 1) x (d + 1)`` crop holds.

        Because paper Eq. 1 normalises each target's column over its allowed sources,
        for emitted graphs this is the graph scored with the pairs farther than
        ``max_distance`` masked out before normalising (squared ReLU or softmax
        alike), up to rounding: a weight that already underflowed to zero beside much
        heavier far-away sources stays absent. Use it when a predictor with a learned
        distance term (``position='relative'`` or ``'grid'``, extensions of the paper)
        is applied to longer sequences or larger images than it was pretrained on: its
        scores at distances it never saw are extrapolations, and can put real weight on
        far-away units. Give the pretraining window minus 1 (e.g. 63 for 64-token
        sequences, 15 for 16 x 16 crops; :attr:`PretrainedGraphPredictor.trained_length`
        and ``trained_size`` record the window).

        Uniform graphs stay uniform over each target's windowed sources and propagate in
        O(N) (prefix sums along sequences, box sums over images); fused graphs stay
        fused, with the window in FlexAttention's block mask (so far-apart blocks are
        skipped); dense graphs become masked blocks; sparse graphs keep their filtered
        edges. Graphs whose sequences hold no pair farther apart come back as they are.
        Differentiable w.r.t. the edge weights. Materialising windowed fused graphs (their
        edges, dense blocks, or the sparse fallback where FlexAttention has no backward)
        still scores every pair first: ``O(T^2)`` per sequence, under the same size limit
        as the full graphs. :meth:`density` and the other statistics still count every
        pair the direction allows."""
        max_distance = check_max_distance(max_distance)
        s, order = self.sequences, self.order
        if type(order) not in (SequenceOrder, RasterOrder):  # the lazy layouts know only these
            raise ValueError(f"within() cuts sequences and raster-ordered images; these graphs "
                             f"follow {order!r}")
        if max_distance >= order.longest_window_distance(s.max_len):  # nothing farther apart
            return self
        if self._uniform_layers is not None or self._fused is not None:
            out = LatentGraphs.__new__(LatentGraphs)
            out._init([], [], [], self.num_heads, self.direction, s, self.include_self,
                      sorted_edges=True, normalization=self._normalization,
                      fused=None if self._fused is None else list(self._fused))
            if self._uniform_layers is not None:  # (edges, if built, are rebuilt lazily)
                out._edges, out._uniform_layers = None, self._uniform_layers
            out._window = max_distance if self._window is None else min(self._window,
                                                                         max_distance)
            return out.with_order(self._order)
        if self._dense is not None:
            return LatentGraphs.from_trusted_dense(
                [self._cut_block(block, max_distance) for block in self._dense],
                direction=self.direction, sequences=s, include_self=self.include_self
            ).with_order(self._order)
        out = LatentGraphs.from_trusted_edges(
            *map(list, zip(*(self._cut_edges(e, max_distance) for e in self._sparse_edges()))),
            num_heads=self.num_heads, direction=self.direction, sequences=s,
            include_self=self.include_self)
        out._sorted = self._sorted  # filtering keeps the (head, target, source) order
        return out.with_order(self._order)

    def _near(self, target: Tensor, source: Tensor, max_distance: int) -> Tensor:
        """Which (flat) target, source pairs lie within the window."""
        position = self.sequences.position
        return self.order.window_distance(position[target], position[source]) <= max_distance

    def _cut_edges(self, edges: LayerEdges, max_distance: int) -> LayerEdges:
        """One layer's edges within the window, each target's total weight kept."""
        (src, tgt), w, h = edges
        n = self.num_nodes
        keep = self._near(tgt, src, max_distance)
        column = h.to(torch.int64) * n + tgt
        before = w.new_zeros(self.num_heads * n).index_add(0, column, w)
        src, tgt, w, h, column = src[keep], tgt[keep], w[keep], h[keep], column[keep]
        total = w.new_zeros(self.num_heads * n).index_add(0, column, w)
        # w / total <= 1 first, then the old total: no overflow for tiny totals (a
        # column of zero weights, possible only in user-given graphs, stays zero)
        w = w / total.masked_fill(total == 0, 1)[column] * before[column]
        return torch.stack([src, tgt]), w, h

    def _cut_block(self, block: Tensor, max_distance: int) -> Tensor:
        """One layer's ``[B, H, T, T]`` block within the window, totals kept."""
        pos = torch.arange(block.size(-1), device=block.device)
        near = self.order.window_distance(pos.view(1, -1), pos.view(-1, 1)) <= max_distance
        kept = block * near.to(block.dtype)  # [i, j]: source i, target j
        total = kept.sum(-2, keepdim=True)  # per target j: over its sources i
        # kept / total <= 1 first: a tiny total cannot overflow the rescaling
        return kept / total.masked_fill(total == 0, 1) * block.sum(-2, keepdim=True)

    # --- conversion ---------------------------------------------------------------
    def _map(self, fn) -> "LatentGraphs":
        s = self.sequences
        seqs = SequenceBatch(fn(s.batch), fn(s.ptr), fn(s.lengths), fn(s.position), s.max_len)
        if self._uniform_layers is not None:
            out = LatentGraphs.__new__(LatentGraphs)
            out._init([], [], [], self.num_heads, self.direction, seqs, self.include_self,
                      sorted_edges=True)
            out._edges, out._uniform_layers = None, self._uniform_layers
            out._window = self._window
            return out.with_order(self._order)
        if self._dense is not None:
            return LatentGraphs.from_trusted_dense([fn(t) for t in self._dense],
                                                   direction=self.direction, sequences=seqs,
                                                   include_self=self.include_self
                                                   ).with_order(self._order)
        if self._fused is not None:
            out = LatentGraphs.from_trusted_fused([(fn(k), fn(q)) for k, q in self._fused],
                                                  direction=self.direction, sequences=seqs,
                                                  include_self=self.include_self,
                                                  normalization=self._normalization)
            out._window = self._window
            return out.with_order(self._order)
        out = LatentGraphs.from_trusted_edges([fn(t) for t in self.edge_index],
                                              [fn(t) for t in self.edge_weight],
                                              [fn(t) for t in self.edge_head],
                                              num_heads=self.num_heads, direction=self.direction,
                                              sequences=seqs,
                                              include_self=self.include_self)
        out._sorted = self._sorted
        return out.with_order(self._order)

    def to(self, device: Union[str, torch.device]) -> "LatentGraphs":
        """The graphs on ``device`` (a device only: a dtype would also convert the node
        ids and heads, which must stay int64)."""
        if isinstance(device, torch.dtype):
            raise TypeError("LatentGraphs.to takes a device, not a dtype: node ids and heads "
                            "must stay int64 (weights follow the features' dtype when used)")
        device = torch.device(device)
        return self._map(lambda t: t.to(device))

    def detach(self) -> "LatentGraphs":
        return self._map(lambda t: t.detach())

    def to_dense(self, layer: Optional[int] = None) -> Tensor:
        """Dense affinities ``[L, B, H, T_max, T_max]`` with ``[l, b, h, i, j] = G_ij``.

        Zero at padding and at pruned pairs. Differentiable w.r.t. the edge
        weights. With ``layer`` given, returns that layer's ``[B, H, T, T]``.
        """
        layers = range(self.num_layers) if layer is None else [self._layer_index(layer)]
        if self._dense is None:
            self._check_size("dense")
        if self._dense is not None or self._fused is not None:
            out = [self.dense_layer(l) for l in layers]
            return out[0] if layer is not None else torch.stack(out)
        b_, t_ = self.num_sequences, self.sequences.max_len
        out = []
        for l in layers:
            (src, tgt), w, h = self.layer(l)
            seq = self.batch[tgt]
            dense = w.new_zeros(b_, self.num_heads, t_, t_)
            out.append(dense.index_put((seq, h, src - self.ptr[seq], tgt - self.ptr[seq]), w))
        return out[0] if layer is not None else torch.stack(out)

    # --- conversions (implemented in glomo_pyg.graph_conversion) ---------------------
    def to_networkx(self, sample: int, layer: Optional[int] = None, head: Optional[int] = None,
                    labels: Optional[Sequence] = None):
        """One sequence's graphs as a networkx graph; see
        :func:`glomo_pyg.graph_conversion.to_networkx`."""
        return graph_conversion.to_networkx(self, sample, layer, head, labels)

    def adjacency(self, sample: int, layer: int, head: int) -> Tensor:
        """``G`` of one sequence, layer and head as a sparse COO ``[T, T]``; see
        :func:`glomo_pyg.graph_conversion.adjacency`."""
        return graph_conversion.adjacency(self, sample, layer, head)

    def hierarchical(self, sample: int, layer: int, head: int) -> Tensor:
        r"""Explicit :math:`\Lambda^l = G^1 \cdots G^l` of one sequence and head; see
        :func:`glomo_pyg.graph_conversion.hierarchical`."""
        return graph_conversion.hierarchical(self, sample, layer, head)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(layers={self.num_layers}, heads={self.num_heads}, "
                f"direction='{self.direction}', layout='{self.layout}', "
                f"sequences={self.num_sequences}, nodes={self.num_nodes}, edges={self.num_edges})")


class DirectionalGraphs(NamedTuple):
    """Graphs of the forward and the backward predictor (``None`` if absent)."""

    forward: Optional[LatentGraphs]
    backward: Optional[LatentGraphs]


def check_max_distance(value, optional: bool = False) -> Optional[int]:
    """``value`` as the window of :meth:`LatentGraphs.within`: an integer >= 1 (Python,
    numpy or 0-d tensor; not a bool), or ``None`` where ``optional``."""
    if value is None and optional:
        return None
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < 1:
        raise ValueError(f"max_distance must be {'None or ' if optional else ''}an integer >= 1 "
                         f"(units), got {value!r}")
    return number


def _check_ptr(ptr: Tensor) -> SequenceBatch:
    if not isinstance(ptr, Tensor) or ptr.dtype != torch.long or ptr.dim() != 1 or \
            ptr.numel() < 2:
        raise ValueError("ptr must be an int64 [B + 1] tensor of sequence offsets (B >= 1)")
    if int(ptr[0]) != 0 or bool((ptr[1:] < ptr[:-1]).any()):
        raise ValueError("ptr must start at 0 and never decrease")
    # read the limits from the module at call time, so users can raise them
    if int(ptr[-1]) > sequences.MAX_UNITS:
        raise ValueError(f"ptr claims {int(ptr[-1])} units, more than "
                         f"glomo_pyg.sequences.MAX_UNITS = {sequences.MAX_UNITS} (per-unit "
                         "vectors would not fit in memory); split the batch or raise the limit")
    if ptr.numel() - 1 > int(ptr[-1]) + sequences.MAX_EMPTY_SEQUENCES:
        raise ValueError(f"ptr has {ptr.numel() - 1} sequences for {int(ptr[-1])} units: at "
                         "most N + glomo_pyg.sequences.MAX_EMPTY_SEQUENCES are accepted")
    return SequenceBatch.from_ptr(ptr)


def _check_layer(l: int, ei, ew, eh, seqs: SequenceBatch, num_heads: int,
                 rule: Optional[SequenceOrder] = None) -> None:
    if not all(isinstance(t, Tensor) for t in (ei, ew, eh)):
        raise ValueError(f"layer {l}: edge_index, edge_weight and edge_head must be tensors")
    if ei.dim() != 2 or ei.size(0) != 2 or ew.shape != (ei.size(1),) or eh.shape != ew.shape:
        raise ValueError(f"layer {l}: expected edge_index [2, E], edge_weight [E], "
                         f"edge_head [E]; got {tuple(ei.shape)}, {tuple(ew.shape)}, "
                         f"{tuple(eh.shape)}")
    if ei.dtype != torch.long or eh.dtype != torch.long or not ew.dtype.is_floating_point:
        raise ValueError(f"layer {l}: edge_index and edge_head must be int64 and edge_weight "
                         f"floating point, got {ei.dtype}, {eh.dtype}, {ew.dtype}")
    device = seqs.ptr.device
    if ei.device != device or ew.device != device or eh.device != device:
        raise ValueError(f"layer {l}: edges must be on the device of ptr ({device})")
    if ei.size(1) == 0:
        return
    n = seqs.num_nodes
    if int(ei.min()) < 0 or int(ei.max()) >= n:
        raise ValueError(f"layer {l}: edge_index holds node ids outside [0, {n}) (ptr covers "
                         f"{n} units)")
    if int(eh.min()) < 0 or int(eh.max()) >= num_heads:
        raise ValueError(f"layer {l}: edge_head holds heads outside [0, {num_heads})")
    if bool((seqs.batch[ei[0]] != seqs.batch[ei[1]]).any()):
        raise ValueError(f"layer {l}: an edge connects two different sequences")
    if rule is not None:
        start = seqs.ptr[seqs.batch[ei[1]]]
        if not bool(rule.allowed(target=ei[1] - start, source=ei[0] - start).all()):
            raise ValueError(f"layer {l}: an edge goes against the {rule.direction} order "
                             f"(include_self={rule.include_self}): forward graphs take "
                             "earlier sources, backward graphs later ones")
    if not bool(torch.isfinite(ew).all()) or bool((ew < 0).any()):
        raise ValueError(f"layer {l}: edge weights must be finite and non-negative")
