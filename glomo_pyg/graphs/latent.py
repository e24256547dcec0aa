"""The one graph object of the library (:class:`LatentGraphs`) and the forward/backward
pair a bidirectional predictor emits."""
from __future__ import annotations

from typing import Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union, cast

import torch
from torch import Tensor

from glomo_pyg import graph_conversion
from glomo_pyg.graphs.checks import (
    MAX_HEADS,
    check_dense_blocks,
    check_direction,
    check_edge_layer,
    check_fixed_graphs,
    check_int,
    check_max_distance,
    check_ptr,
)
from glomo_pyg.graphs.storage import (
    DenseStorage,
    EdgeStorage,
    FusedStorage,
    GraphFrame,
    GraphStorage,
    HeadMeanStorage,
    LayerEdges,
    UniformStorage,
)
from glomo_pyg.ordering import RasterOrder, SequenceOrder, UnitOrder
from glomo_pyg.sequences import SequenceBatch

# Short keys of the two directions, for ModuleDicts ('forward' is a Module method).
DIRECTION_KEYS = {"forward": "fw", "backward": "bw"}


class LatentGraphs:
    r"""Sparse weighted graphs emitted by a graph predictor (paper Sec. 2.1, Eq. 1).

    For every graph layer ``l`` the edges of all heads and sequences are stored together:

    * ``edge_index[l]``: ``[2, E_l]`` int64, row 0 the source ``i``, row 1 the
      target ``j``, as flat node ids ``0..N-1`` (PyG's ``source_to_target``);
    * ``edge_weight[l]``: ``[E_l]``, :math:`G^{l,h}_{ij} > 0`;
    * ``edge_head[l]``: ``[E_l]`` head id of each edge.

    Emitted edges are sorted by ``(head, target, source)``; each target's incoming
    weights sum to 1, or it has no incoming edge. The constructor validates its input. One
    storage per layer, all in one :attr:`layout`: ``'sparse'``, ``'dense'`` or ``'fused'``.

    Args:
        edge_index, edge_weight, edge_head: one tensor per layer.
        num_heads: heads per layer.
        direction: ``'forward'`` (sources precede targets) or ``'backward'``.
        ptr: ``[B + 1]`` offsets of the sequences in the flat node order.
        include_self: whether ``i = j`` edges were allowed.
        order: the allowed-sources rule (:meth:`with_order`).
    """

    _frame: GraphFrame
    _storages: Tuple[GraphStorage, ...]

    def __init__(self, edge_index: List[Tensor], edge_weight: List[Tensor], edge_head: List[Tensor],
                 *, num_heads: int, direction: str, ptr: Tensor, include_self: bool = False,
                 order: Optional[UnitOrder] = None):
        check_direction(direction)
        check_int("num_heads", num_heads, high=MAX_HEADS)
        edge_index, edge_weight, edge_head = list(edge_index), list(edge_weight), list(edge_head)
        if not edge_index or not len(edge_index) == len(edge_weight) == len(edge_head):
            raise ValueError("edge_index, edge_weight and edge_head need one entry per layer "
                             "each, for at least one layer")
        sequences = check_ptr(ptr)
        for l, (ei, ew, eh) in enumerate(zip(edge_index, edge_weight, edge_head)):
            check_edge_layer(l, ei, ew, eh, sequences, num_heads,
                             SequenceOrder(direction, include_self))
        self._frame = GraphFrame(sequences, num_heads, direction, include_self)
        self._storages = tuple(EdgeStorage(ei, ew, eh, sorted_edges=False)
                               for ei, ew, eh in zip(edge_index, edge_weight, edge_head))
        self.with_order(order)

    @classmethod
    def _framed(cls, frame: GraphFrame, storages: List[GraphStorage]) -> "LatentGraphs":
        graphs = cls.__new__(cls)
        graphs._frame, graphs._storages = frame, tuple(storages)
        return graphs

    def _like(self, storages: List[GraphStorage]) -> "LatentGraphs":
        """Other storages in this batch and order (a new frame: caches start empty)."""
        return LatentGraphs._framed(self._frame.replace(), storages)

    @classmethod
    def from_storage(cls, storages: Sequence[GraphStorage], *, num_heads: int, direction: str,
                     sequences: SequenceBatch, include_self: bool = False,
                     order: Optional[UnitOrder] = None) -> "LatentGraphs":
        """Graphs from one storage per layer (at least one, all of one layout) that code
        built itself: **not checked**. Others use the constructor or :meth:`from_dense`."""
        graphs = cls._framed(GraphFrame(sequences, num_heads, direction, include_self),
                             list(storages))
        return graphs.with_order(order)

    @classmethod
    def from_trusted_edges(cls, edge_index: List[Tensor], edge_weight: List[Tensor],
                           edge_head: List[Tensor], *, num_heads: int, direction: str,
                           sequences: SequenceBatch, include_self: bool = False
                           ) -> "LatentGraphs":
        """Sparse graphs from valid edges sorted by (head, target): unchecked."""
        return cls.from_storage([EdgeStorage(*e) for e in zip(edge_index, edge_weight, edge_head)],
                                num_heads=num_heads, direction=direction, sequences=sequences,
                                include_self=include_self)

    @classmethod
    def from_trusted_dense(cls, blocks: List[Tensor], *, direction: str,
                           sequences: SequenceBatch, include_self: bool = False
                           ) -> "LatentGraphs":
        """Dense graphs from ``[B, H, T, T]`` blocks, unchecked (:meth:`from_dense` checks)."""
        return cls.from_storage([DenseStorage(b) for b in blocks], num_heads=blocks[0].shape[1],
                                direction=direction, sequences=sequences,
                                include_self=include_self)

    @classmethod
    def from_trusted_fused(cls, layers: List[Tuple[Tensor, Tensor]], *, direction: str,
                           sequences: SequenceBatch, include_self: bool = False,
                           normalization: str = "relu2") -> "LatentGraphs":
        """Fused graphs from per-layer augmented ``[B, H, T, D]`` (keys, queries), unchecked."""
        return cls.from_storage([FusedStorage(k, q, normalization) for k, q in layers],
                                num_heads=layers[0][0].shape[1], direction=direction,
                                sequences=sequences, include_self=include_self)

    @classmethod
    def from_dense(cls, dense: Union[Tensor, Sequence[Tensor]], *, direction: str, ptr: Tensor,
                   include_self: bool = False) -> "LatentGraphs":
        """Graphs in the dense layout: one ``[B, H, T, T]`` block per layer (a list or an
        ``[L, B, H, T, T]`` tensor), ``[b, h, i, j] = G_ij``, zero at padding and absent
        edges. Weights must be finite, non-negative, and zero outside the pairs the
        direction allows (:class:`ValueError` otherwise)."""
        check_direction(direction)
        blocks = list(dense.unbind(0)) if isinstance(dense, Tensor) else list(dense)
        seqs = check_ptr(ptr)
        check_dense_blocks(blocks, seqs, direction, include_self)
        return cls.from_trusted_dense(blocks, direction=direction, sequences=seqs,
                                      include_self=include_self)

    @classmethod
    def uniform(cls, ptr: Tensor, *, num_layers: int, num_heads: int, direction: str,
                include_self: bool = False, order: Optional[UnitOrder] = None
                ) -> "LatentGraphs":
        """The uniform baseline: every allowed source of a target gets ``1 / number of
        allowed sources``, for every layer and head; propagated in O(N), the O(T^2) edges
        built only when asked for."""
        seqs = check_fixed_graphs(ptr, direction, num_layers, num_heads)
        return cls.from_storage([UniformStorage()] * num_layers, num_heads=num_heads,
                                direction=direction, sequences=seqs, include_self=include_self,
                                order=order)

    @classmethod
    def adjacent(cls, ptr: Tensor, *, num_layers: int, num_heads: int, direction: str,
                 include_self: bool = False, order: Optional[UnitOrder] = None
                 ) -> "LatentGraphs":
        """The adjacent-unit baseline (a control, not in the paper): each target's one
        source is its neighbour (``t - 1`` forward, ``t + 1`` backward) with weight 1, for
        every layer and head; ``include_self`` and ``order`` are only recorded."""
        seqs = check_fixed_graphs(ptr, direction, num_layers, num_heads)
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
        return cls.from_storage([EdgeStorage(edges, weight, heads)] * num_layers,
                                num_heads=num_heads, direction=direction, sequences=seqs,
                                include_self=include_self, order=order)

    def with_order(self, order: Optional[UnitOrder]) -> "LatentGraphs":
        """Attach the allowed-sources rule these graphs were emitted under (e.g. a
        :class:`~glomo_pyg.ordering.RasterOrder`); returns ``self``. It must match the
        graphs' direction and ``include_self``."""
        if order is None:
            return self
        units = getattr(order, "num_units", None)
        if not isinstance(order, SequenceOrder) or \
                (order.direction, order.include_self) != (self.direction, self.include_self) or \
                (units is not None and any(n != units for n in self.sequences.sizes)):
            raise ValueError(f"order {order!r} must be a SequenceOrder (e.g. RasterOrder: the "
                             f"kernels mask sources by position), match the graphs' direction "
                             f"{self.direction!r} and include_self={self.include_self} and "
                             f"cover each sequence's units (lengths "
                             f"{sorted(set(self.sequences.sizes))[:5]})")
        self._frame = self._frame.replace(order=order)  # what was cached depends on it
        return self

    @property
    def storages(self) -> Tuple[GraphStorage, ...]:
        """One :mod:`storage <glomo_pyg.graphs.storage>` per layer."""
        return self._storages

    @property
    def frame(self) -> GraphFrame:
        """What the layers share (sequences, heads, direction, order)."""
        return self._frame

    @property
    def num_heads(self) -> int:
        return self._frame.num_heads

    @property
    def direction(self) -> str:
        return self._frame.direction

    @property
    def include_self(self) -> bool:
        return self._frame.include_self

    @property
    def sequences(self) -> SequenceBatch:
        return self._frame.sequences

    @property
    def layout(self) -> str:
        """``'sparse'``, ``'dense'`` or ``'fused'``."""
        return self._storages[0].layout

    @property
    def fused_layers(self) -> Optional[List[Tuple[Tensor, Tensor]]]:
        """Fused layout: per layer the augmented ``[B, H, T, D]`` (keys, queries) whose
        inner products are the graph scores; ``None`` in the other layouts and for
        head-averaged graphs (:meth:`mean_heads`), which are no inner products."""
        fused = all(isinstance(s, FusedStorage) for s in self._storages)  # (not head means)
        return [(s.keys, s.queries) for s in cast(Tuple[FusedStorage, ...], self._storages)] \
            if fused else None

    @property
    def normalization(self) -> str:
        """``'relu2'`` (paper Eq. 1) or ``'softmax'`` (the "-sparse" ablation); known only
        in the fused layout (``'relu2'`` in the others)."""
        return getattr(self._storages[0], "normalization", "relu2")

    @property
    def window(self) -> Optional[int]:
        """The longest edge kept (:meth:`within`) where applied lazily (uniform, fused)."""
        return getattr(self._storages[0], "window", None)

    @property
    def order(self) -> UnitOrder:
        """The allowed-sources rule of these graphs (:mod:`glomo_pyg.ordering`)."""
        return self._frame.order

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
        return len(self._storages)

    @property
    def num_nodes(self) -> int:
        return self.sequences.num_nodes

    @property
    def num_sequences(self) -> int:
        return self.sequences.num_sequences

    @property
    def num_edges(self) -> List[int]:
        return [s.num_edges(self._frame) for s in self._storages]

    @property
    def device(self) -> torch.device:
        return self.ptr.device

    def _layer_index(self, l: int) -> int:
        """``l`` as an index in ``0..num_layers - 1`` (negative counts from the end)."""
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

    @property
    def edge_index(self) -> List[Tensor]:
        return [e[0] for e in self]

    @property
    def edge_weight(self) -> List[Tensor]:
        return [e[1] for e in self]

    @property
    def edge_head(self) -> List[Tensor]:
        return [e[2] for e in self]

    def layer(self, l: int) -> LayerEdges:
        """``(edge_index, edge_weight, edge_head)`` of graph layer ``l``."""
        return self._storages[self._layer_index(l)].edges(self._frame)

    def __iter__(self) -> Iterator[LayerEdges]:
        return (self.layer(l) for l in range(self.num_layers))

    def dense_layer(self, l: int) -> Tensor:
        """``[B, H, T, T]`` block of layer ``l`` (``[b, h, i, j] = G_ij``), differentiable."""
        return self._storages[self._layer_index(l)].dense(self._frame)

    def to_dense(self, layer: Optional[int] = None) -> Tensor:
        """Dense affinities ``[L, B, H, T_max, T_max]``, ``[l, b, h, i, j] = G_ij`` (zero
        at padding and pruned pairs; differentiable), or ``layer``'s ``[B, H, T, T]``."""
        if layer is not None:
            return self.dense_layer(layer)
        if self.layout != "dense":
            self._frame.check_size("dense")  # before the first layer is built
        return torch.stack([s.dense(self._frame) for s in self._storages])

    def to_sparse(self) -> "LatentGraphs":
        """The same graphs in the sparse layout (``self`` if already sparse)."""
        if self.layout == "sparse":
            return self
        return self._like([EdgeStorage(*e) for e in self])

    def to_dense_layout(self) -> "LatentGraphs":
        """The same graphs in the dense layout (``self`` if already dense)."""
        if self.layout == "dense":
            return self
        return self._like([DenseStorage(self.dense_layer(l)) for l in range(self.num_layers)])

    def propagate(self, x: Tensor, layer: int) -> Tensor:
        r"""Per-head propagation along graph layer ``layer``:
        :math:`P^{(h)}_j = \sum_i G^{l,h}_{ij}\, x^{(h)}_i`.

        ``x`` is ``[N, C]`` (shared by the heads) or ``[H, N, C]`` (head ``h`` propagates
        ``x[h]``); the result is ``[H, N, C]``, differentiable w.r.t. ``x`` and the weights.
        Only the shape of ``x`` is checked (no sync)."""
        if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() not in (2, 3) or \
                x.size(-2) != self.num_nodes or (x.dim() == 3 and x.size(0) != self.num_heads):
            raise ValueError(f"x must be floating-point [N, C] or [H, N, C] with N = "
                             f"{self.num_nodes} units and H = {self.num_heads} heads, got "
                             f"{getattr(x, 'dtype', type(x).__name__)} "
                             f"{tuple(getattr(x, 'shape', ()))}")
        return self._storages[self._layer_index(layer)].propagate(self._frame, x)

    def density(self) -> List[float]:
        """Fraction of allowed (source, target) pairs that carry an edge, per layer."""
        total = float(self.order.num_pairs(self.lengths).sum()) * self.num_heads
        return [e / total if total else 0.0 for e in self.num_edges]

    def column_entropy(self, normalized: bool = True) -> Tensor:
        r"""Entropy of every target's incoming weights, ``[L, H, N]``.

        :math:`H^{l,h}_j = -\sum_i G^{l,h}_{ij} \log G^{l,h}_{ij}`; with ``normalized``
        divided by :math:`\log n_j`, :math:`n_j` its allowed sources (1 is uniform, 0 a
        single source). ``NaN`` for targets with no incoming edge or fewer than two
        allowed sources. Differentiable w.r.t. the edge weights.
        """
        s, h_ = self.sequences, self.num_heads
        allowed = self.order.num_sources(s.position, s.lengths[s.batch])  # [N]
        out = []
        for (_, tgt), w, h in self:
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
        target's remaining weights rescaled to their former total; differentiable.

        Length is :meth:`UnitOrder.window_distance <glomo_pyg.ordering.UnitOrder.window_distance>`:
        ``|i - j|``, or for raster-ordered pixels the larger of the row and column
        offsets. For emitted graphs this equals masking the farther pairs before
        normalising (paper Eq. 1)."""
        max_distance = check_max_distance(max_distance)
        order = self.order
        if type(order) not in (SequenceOrder, RasterOrder):  # the lazy layouts know only these
            raise ValueError(f"within() cuts sequences and raster-ordered images; these graphs "
                             f"follow {order!r}")
        if max_distance >= order.longest_window_distance(self.sequences.max_len):
            return self  # nothing farther apart
        return self._like(self._each_storage(lambda s: s.within(self._frame, max_distance)))

    def mean_heads(self) -> "LatentGraphs":
        r"""The graphs averaged over the heads of each layer,
        :math:`\bar G^l = \frac{1}{H} \sum_h G^{l,h}`, as one-head graphs (each
        target's weights still sum to at most 1). Propagating them costs one product per
        layer, not one per head, in the fused layout on the CPU; products of these
        layers (:class:`~glomo_pyg.GraphMixer`'s :math:`\Lambda`) are products of the
        averages, not averages of the per-head products."""
        if self.num_heads == 1:
            return self
        frame = self._frame
        merged = GraphFrame(frame.sequences, 1, frame.direction, frame.include_self,
                            frame.explicit_order)
        return LatentGraphs._framed(merged, self._each_storage(
            lambda s: HeadMeanStorage(s, self.num_heads)))

    def _each_storage(self, fn) -> List[GraphStorage]:
        """``fn`` of each storage; one shared by several layers (uniform, adjacent) stays so."""
        done = {}
        for s in self._storages:
            if id(s) not in done:
                done[id(s)] = fn(s)
        return [done[id(s)] for s in self._storages]

    def _map(self, fn) -> "LatentGraphs":
        s = self.sequences
        seqs = SequenceBatch(fn(s.batch), fn(s.ptr), fn(s.lengths), fn(s.position), s.sizes)
        return LatentGraphs._framed(self._frame.replace(sequences=seqs),
                                    self._each_storage(lambda st: st.apply(fn)))

    def to(self, device: Union[str, torch.device]) -> "LatentGraphs":
        """The graphs on ``device`` (not a dtype: node ids and heads stay int64)."""
        if isinstance(device, torch.dtype):
            raise TypeError("LatentGraphs.to takes a device, not a dtype: node ids and heads "
                            "must stay int64 (weights follow the features' dtype when used)")
        device = torch.device(device)
        return self._map(lambda t: t.to(device))

    def detach(self) -> "LatentGraphs":
        return self._map(lambda t: t.detach())

    def to_networkx(self, sample: int, layer: Optional[int] = None, head: Optional[int] = None,
                    labels: Optional[Sequence] = None):
        """See :func:`glomo_pyg.graph_conversion.to_networkx`."""
        return graph_conversion.to_networkx(self, sample, layer, head, labels)

    def adjacency(self, sample: int, layer: int, head: int) -> Tensor:
        """See :func:`glomo_pyg.graph_conversion.adjacency`."""
        return graph_conversion.adjacency(self, sample, layer, head)

    def hierarchical(self, sample: int, layer: int, head: int) -> Tensor:
        """See :func:`glomo_pyg.graph_conversion.hierarchical`."""
        return graph_conversion.hierarchical(self, sample, layer, head)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(layers={self.num_layers}, heads={self.num_heads}, "
                f"direction='{self.direction}', layout='{self.layout}', "
                f"sequences={self.num_sequences}, nodes={self.num_nodes}, edges={self.num_edges})")


class DirectionalGraphs(NamedTuple):
    """Graphs of the forward and the backward predictor (``None`` if absent)."""

    forward: Optional[LatentGraphs]
    backward: Optional[LatentGraphs]

    @property
    def extent(self) -> Union[int, Tuple[int, int]]:
        """How far apart their units can be, as a distance term reads it: the longest
        sequence's length, or ``(height, width)`` for raster-ordered images."""
        graphs = next(g for g in self if g is not None)
        order = graphs.order
        if isinstance(order, RasterOrder):
            return (order.height, order.width)
        return graphs.sequences.max_len

    def within(self, max_distance: Optional[int]) -> "DirectionalGraphs":
        """Each direction's :meth:`LatentGraphs.within` (``None``: these graphs)."""
        if max_distance is None:
            return self
        return DirectionalGraphs(*(None if g is None else g.within(max_distance) for g in self))
